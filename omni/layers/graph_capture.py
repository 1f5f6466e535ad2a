"""The one CUDA-graph capture recipe of every graph omni records (decode steps, the code predictor, the
codec, diffusion steps), and `ShapeGraphs`: a forward replayed per input shape."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import torch

# Several stages share a process in inline mode and set up at once: one capture at a time, and no
# device-wide synchronize (another thread's capture would make it fail), only this stream's.
_CAPTURE_LOCK = threading.Lock()
log = logging.getLogger("omni.graphs")


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


class ShapeGraphs:
    """`fn(x)` replayed from a CUDA graph per input shape captured ahead (`capture`; rows padded up to
    a captured count), eagerly for any other shape: a forward of many small kernels whose shapes repeat
    (a vocoder's chunk windows). The graphs share one memory pool, so a replay may write over another
    graph's output: each call returns a copy of its own (on the H200, two windows' PCM read after both
    replays came out wrong)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], device) -> None:
        self.fn, self.device = fn, torch.device(device)
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.pool = None
        self.replays = 0

    def capture(self, shapes: list[tuple[int, ...]], dtype: torch.dtype) -> int:
        """Graphs of the shapes, largest first (the rest reuse its pool); stops at the first that
        fails (out of memory, a kernel that cannot be captured). Returns how many there are."""
        if self.device.type != "cuda":
            return 0
        for shape in sorted(set(shapes), key=lambda s: -torch.Size(s).numel()):
            static = torch.zeros(shape, dtype=dtype, device=self.device)
            try:
                graph, out = capture_graph(lambda: self.fn(static), self.device, self.pool)
            except Exception as exc:  # serve eagerly rather than fail: the graphs only save launches
                torch.cuda.current_stream(self.device).synchronize()
                log.warning("CUDA graph of shape %s not captured (%s: %s)", shape,
                                                        type(exc).__name__, exc)
                break
            self.pool = graph.pool()
            self.graphs[tuple(shape)] = (graph, static, out)
        return len(self.graphs)

    def agrees(self, inputs: list[torch.Tensor], tol: float = 1e-3) -> bool:
        """Every input through the graphs one after another, then each eagerly: the replays' outputs,
        all read after the last replay, within `tol` of the peak of the eager ones."""
        replayed = [self(x) for x in inputs]
        for x, got in zip(inputs, replayed):
            want = self.fn(x)
            if (got - want).abs().max().item() > tol * max(want.abs().max().item(), 1e-6):
                log.warning("CUDA graphs of shape %s replay %.3g away from the eager forward", tuple(x.shape),
                            (got - want).abs().max().item())
                return False
        return True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """fn(x); x's rows are padded (with zeros) to the fewest of a captured shape with its other
        dims: fn must treat rows independently."""
        rest = tuple(x.shape[1:])
        fits = [k for k in self.graphs if k[1:] == rest and k[0] >= x.shape[0]]
        if not fits:
            return self.fn(x)
        graph, static, out = self.graphs[min(fits)]
        n = x.shape[0]
        static[:n].copy_(x)
        static[n:].zero_()
        graph.replay()
        self.replays += 1
        return out[:n].clone()
