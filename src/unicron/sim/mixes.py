"""Failure-kind mixes for the trace generator, with their sources.

Both are embedded copies of files in the repository's data/ folder (a test checks they agree),
so the installed package needs no data file. Each maps a kind of the taxonomy to a weight.
"""

from __future__ import annotations

from unicron.core.taxonomy import ErrorKind

# Alibaba's platform, Unicron paper Figure 1 (data/unicron_termination_mix.csv): share of
# the top 5% largest tasks, in percent. "finished" (56.6%) is not a failure and is left out.
UNICRON_TERMINATION_MIX: dict[ErrorKind, float] = {
    ErrorKind.NCCL_TIMEOUT: 10.1,
    ErrorKind.ECC_ERROR: 5.0,
    ErrorKind.NVLINK_ERROR: 4.5,
    ErrorKind.OTHER_NETWORK_ERROR: 4.0,
    ErrorKind.LINK_FLAPPING: 3.9,
    ErrorKind.OTHER: 3.3,
    ErrorKind.TASK_HANG: 3.1,
    ErrorKind.ILLEGAL_MEMORY_ACCESS: 2.1,
    ErrorKind.INVALID_DMA_MAPPING: 2.1,
    ErrorKind.CONNECTION_REFUSED: 2.1,
    ErrorKind.CUDA_ERROR: 1.6,
    ErrorKind.CONNECTION_RESET: 1.0,
    ErrorKind.GPU_DRIVER_ERROR: 0.6,
}

# Llama 3 405B pre-training, 419 interruptions in 54 days (arXiv 2407.21783, Table 5;
# data/llama3_interruptions.csv), counts per component.
LLAMA3_COUNTS: dict[str, int] = {
    "Faulty GPU": 148,
    "GPU HBM3 memory": 72,
    "Software bug": 54,
    "Network switch/cable": 35,
    "Host maintenance": 32,
    "GPU SRAM memory": 19,
    "GPU system processor": 17,
    "NIC": 7,
    "NCCL watchdog timeouts": 7,
    "Silent data corruption": 6,
    "GPU thermal interface + sensor": 6,
    "SSD": 3,
    "Power supply": 3,
    "Server chassis": 2,
    "IO expansion board": 2,
    "Dependency": 2,
    "CPU": 2,
    "System memory": 2,
}

# Our mapping of Llama 3's components onto the taxonomy: hardware that needs a repair becomes a
# SEV1 kind, software faults a process failure, network faults a network error; silent data
# corruption is its own kind (wrong numbers: ``policy_base.NUMERICAL_KINDS``).
LLAMA3_KIND: dict[str, ErrorKind] = {
    "Faulty GPU": ErrorKind.GPU_DRIVER_ERROR,
    "GPU HBM3 memory": ErrorKind.ECC_ERROR,
    "Software bug": ErrorKind.EXITED_ABNORMALLY,
    "Network switch/cable": ErrorKind.LINK_FLAPPING,
    "Host maintenance": ErrorKind.NODE_LOST,
    "GPU SRAM memory": ErrorKind.ECC_ERROR,
    "GPU system processor": ErrorKind.GPU_DRIVER_ERROR,
    "NIC": ErrorKind.NODE_LOST,
    "NCCL watchdog timeouts": ErrorKind.NCCL_TIMEOUT,
    "Silent data corruption": ErrorKind.SILENT_DATA_CORRUPTION,
    "GPU thermal interface + sensor": ErrorKind.GPU_DRIVER_ERROR,
    "SSD": ErrorKind.NODE_LOST,
    "Power supply": ErrorKind.NODE_LOST,
    "Server chassis": ErrorKind.NODE_LOST,
    "IO expansion board": ErrorKind.NODE_LOST,
    "Dependency": ErrorKind.EXITED_ABNORMALLY,
    "CPU": ErrorKind.NODE_LOST,
    "System memory": ErrorKind.NODE_LOST,
}


def llama3_mix() -> dict[ErrorKind, float]:
    mix: dict[ErrorKind, float] = {}
    for component, count in LLAMA3_COUNTS.items():
        kind = LLAMA3_KIND[component]
        mix[kind] = mix.get(kind, 0.0) + count
    return mix


NAMED_MIXES = {"unicron": UNICRON_TERMINATION_MIX, "llama3": llama3_mix()}
