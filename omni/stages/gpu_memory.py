"""A stage process's CUDA memory, in its stats (so /metrics shows it as `omni_stage_gpu_*_bytes`):
several stages share one GPU and each caching allocator keeps what it once used, so where the
memory went is read per process (weights, KV, graph pools and activations all show in `reserved`)."""

from __future__ import annotations

from typing import Any


def gpu_memory(device: Any) -> dict[str, int]:
    """Bytes held by this process's tensors on `device`, reserved by its allocator, its peak, and
    the device's free bytes; empty off a GPU or before CUDA is in use."""
    if not str(device).startswith("cuda"):
        return {}
    import torch

    if not torch.cuda.is_initialized():
        return {}
    free, _ = torch.cuda.mem_get_info(device)
    return {"gpu_allocated_bytes": torch.cuda.memory_allocated(device),
            "gpu_reserved_bytes": torch.cuda.memory_reserved(device),
            "gpu_peak_bytes": torch.cuda.max_memory_allocated(device), "gpu_free_bytes": free}
