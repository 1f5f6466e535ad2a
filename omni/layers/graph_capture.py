"""The one CUDA-graph capture recipe of every graph omni records (decode steps, the code predictor)."""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch

# Several stages share a process in inline mode and set up at once: one capture at a time, and no
# device-wide synchronize (another thread's capture would make it fail), only this stream's.
_CAPTURE_LOCK = threading.Lock()


@torch.inference_mode()
def capture_graph(body: Callable[[], Any], device, pool=None) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Run `body` twice on a side stream (lazy inits and workspaces stay outside the graph), then
    record it into a graph sharing the memory `pool`; returns the graph and what the recorded call
    returned. In inference mode of its own: callers may sit outside one, and with autograd on,
    weights that require grad made fused kernels' in-place updates fail the capture (H200, 2026-11-30).
    Captures in one process are serialised (inline mode sets up several stages at once)."""
    with _CAPTURE_LOCK:
        return _capture(body, device, pool)


def _capture(body: Callable[[], Any], device, pool) -> tuple[torch.cuda.CUDAGraph, Any]:
    torch.cuda.current_stream(device).synchronize()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            body()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: other stages' threads (inline mode) may use the GPU meanwhile
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        out = body()
    return graph, out
