"""Catalogue of GPU types: peak dense FP16/BF16 FLOP/s, memory and interconnect bandwidths.

Figures are vendor datasheet values (dense, no sparsity). Network bandwidth is per GPU, as in
DGX-style nodes with one NIC per GPU. They are inputs to the analytic throughput model.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3
GB = 1e9


@dataclass(frozen=True)
class GpuType:
    name: str
    peak_flops: float
    memory_bytes: float
    nvlink_bytes_per_s: float  # per GPU, one direction, inside a node
    network_bytes_per_s: float  # per GPU, between nodes


KNOWN_GPUS: dict[str, GpuType] = {
    g.name.lower(): g
    for g in (
        GpuType("V100", 125e12, 32 * GIB, 150 * GB, 12.5 * GB),
        GpuType("A100", 312e12, 80 * GIB, 300 * GB, 25 * GB),
        GpuType("A800", 312e12, 80 * GIB, 200 * GB, 25 * GB),
        GpuType("H100", 989e12, 80 * GIB, 450 * GB, 50 * GB),
        GpuType("H800", 989e12, 80 * GIB, 200 * GB, 50 * GB),
        GpuType("H200", 989e12, 141 * GIB, 450 * GB, 50 * GB),
        GpuType("L40S", 362e12, 48 * GIB, 32 * GB, 25 * GB),
    )
}


def lookup_gpu(name: str) -> GpuType | None:
    """The catalogue entry for ``name`` (case-insensitive), or None."""
    return KNOWN_GPUS.get(name.strip().lower())


def custom_gpu(peak_flops: float) -> GpuType:
    """A GPU known only by its peak FLOP/s; memory and links default to an A100's."""
    a100 = KNOWN_GPUS["a100"]
    return GpuType(
        f"custom({peak_flops / 1e12:g} TFLOP/s)",
        peak_flops,
        a100.memory_bytes,
        a100.nvlink_bytes_per_s,
        a100.network_bytes_per_s,
    )
