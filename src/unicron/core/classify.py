"""Classification of exceptions raised in a worker into the error taxonomy.

The table is data: each rule is (kind, exception type names or None for any, message
patterns). The first rule whose type matches (by class name, anywhere in the MRO) and whose
pattern occurs in the message (case-insensitive) wins. Messages are the ones CUDA, NCCL, gloo
and the Python runtime really print; tests hold real examples.
"""

from __future__ import annotations

import re

from unicron.core.taxonomy import ErrorKind

Rule = tuple[ErrorKind, tuple[str, ...] | None, tuple[str, ...]]

RULES: tuple[Rule, ...] = (
    # The training library's verdicts on a gradient sum that was wrong (train/numerics.py), and on
    # replicas that differ (train/replicacheck.py).
    (ErrorKind.SILENT_DATA_CORRUPTION, ("SilentDataCorruption",), ("",)),
    (ErrorKind.NUMERICAL_DATA, ("NumericalDataFault",), ("",)),
    (ErrorKind.REPLICAS_DIVERGED, ("ReplicasDiverged",), ("",)),
    # Python's own connection errors, whatever their message; and the training library's
    # PeerLostError (train/iteration.py), which a survivor raises for a peer's failure (a
    # collective abandoned, or a replica-mate's sums lost while its own arrived): a consequence
    # to await the cause of, never a failure of the rank that raised it.
    (
        ErrorKind.CONNECTION_RESET,
        ("ConnectionResetError", "ConnectionAbortedError", "BrokenPipeError", "PeerLostError"),
        ("",),
    ),
    (ErrorKind.CONNECTION_REFUSED, ("ConnectionRefusedError",), ("",)),
    (ErrorKind.ECC_ERROR, None, ("uncorrectable ecc error", "ecc error", "double bit ecc")),
    (ErrorKind.NVLINK_ERROR, None, ("nvlink",)),
    (ErrorKind.INVALID_DMA_MAPPING, None, ("invalid dma", "dma mapping")),
    (
        ErrorKind.GPU_DRIVER_ERROR,
        None,
        (
            "driver shutting down",
            "gpu has fallen off the bus",
            "cuda driver",
            "nvml",
            "no cuda gpus are available",
        ),
    ),
    (ErrorKind.ILLEGAL_MEMORY_ACCESS, None, ("illegal memory access", "illegal address")),
    (ErrorKind.OUT_OF_MEMORY, ("OutOfMemoryError", "MemoryError"), ("",)),
    (ErrorKind.OUT_OF_MEMORY, None, ("out of memory", "cannot allocate memory", "can't allocate memory")),
    (ErrorKind.CUDA_ERROR, None, ("cuda error", "cudnn_status", "cublas_status", "device-side assert")),
    (
        ErrorKind.NCCL_TIMEOUT,
        None,
        (
            "watchdog caught collective operation timeout",
            "timed out waiting",
            "operation timed out",
            "collective operation timeout",
        ),
    ),
    (
        ErrorKind.CONNECTION_RESET,
        None,
        ("connection reset by peer", "connection closed by peer", "broken pipe"),
    ),
    (ErrorKind.CONNECTION_REFUSED, None, ("connection refused",)),
    (ErrorKind.LINK_FLAPPING, None, ("link is down", "link flap", "ib port", "net/ib")),
    (
        ErrorKind.OTHER_NETWORK_ERROR,
        None,
        ("nccl error", "gloo", "socket", "network is unreachable", "no route to host"),
    ),
    # The checkpoint storage: full, read-only, not writable, or a torn or corrupt file.
    (
        ErrorKind.STORAGE_ERROR,
        None,
        (
            "no space left on device",
            "read-only file system",
            "disk quota exceeded",
            "corrupt checkpoint",
            "pytorchstreamreader failed",
            "failed finding central directory",
            "invalid load key",
            "unpickling",
        ),
    ),
    (ErrorKind.STORAGE_ERROR, ("PermissionError", "CheckpointWriteError"), ("",)),
    # Errors of the program itself: the Python exceptions a bug raises.
    (
        ErrorKind.USER_ERROR,
        (
            "ValueError",
            "TypeError",
            "KeyError",
            "IndexError",
            "AttributeError",
            "NameError",
            "AssertionError",
            "ZeroDivisionError",
            "NotImplementedError",
            "ImportError",
            "FileNotFoundError",
        ),
        ("",),
    ),
)


def classify(error_type: str, message: str, mro: tuple[str, ...] = ()) -> ErrorKind:
    """The taxonomy kind for an exception, by its type name(s) and message."""
    names = {error_type, *mro}
    text = message.lower()
    for kind, types, patterns in RULES:
        if types is not None and not names.intersection(types):
            continue
        if any(p in text for p in patterns):
            return kind
    return ErrorKind.OTHER


def classify_exception(exc: BaseException) -> ErrorKind:
    mro = tuple(cls.__name__ for cls in type(exc).__mro__)
    return classify(type(exc).__name__, re.sub(r"\s+", " ", str(exc)), mro)
