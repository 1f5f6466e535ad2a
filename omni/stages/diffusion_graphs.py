"""One forward for velocity rows of different lengths, replayed from CUDA graphs.

A model that sets `pad_frames` takes `lengths` in `velocity` and gives each row's real frames as the
row alone gives them (padding at a row's end never reaches them). Then every running window of the
diffusion stage, whatever its length, shares one forward: frames rounded up to a multiple of
`pad_frames`, rows to a batch bucket. On CUDA each (rows, frames) bucket is a CUDA graph over
static buffers, captured at start-up, so a step costs one replay instead of launching every kernel
from Python (a 22-block DiT: ~1,000 kernels a forward, 62 ms of host a step eagerly on an H200 where
the GPU needed 3.4 ms; bench/RESULTS.md 2026-12-04). Padding rows keep finite stale values
and a full length; their output is dropped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from omni.stages.ar.cuda_graphs import batch_buckets

log = logging.getLogger("omni.diffusion_graphs")


@dataclass
class _Static:
    x: torch.Tensor  # [R, F, latent]
    t: torch.Tensor  # [R]
    feats: torch.Tensor  # [R, F, feature]
    lengths: torch.Tensor  # [R] int64
    out: torch.Tensor | None = None
    graph: Any = None


class PaddedVelocity:
    """`model`: a `DiffusionModel` with `pad_frames`; `max_rows`: rows of one forward (guidance rows
    included); `max_frames`: the longest window in frames (0: unbounded, no graphs)."""

    def __init__(self, model, max_rows: int, max_frames: int, cuda_graphs: bool) -> None:
        self.model = model
        self.step = int(model.pad_frames)
        self.row_sizes = batch_buckets(max_rows)
        top = -(-max_frames // self.step) * self.step
        self.frame_sizes = list(range(self.step, top + 1, self.step))
        self.device = torch.device(model.device)
        self.graphs_on = cuda_graphs and self.device.type == "cuda" and bool(self.frame_sizes)
        self.statics: dict[tuple[int, int], _Static] = {}
        self.pool = None
        self.disabled: str | None = None
        self.replays = 0
        self.capture_seconds = 0.0

    def __call__(self, xs: list[torch.Tensor], ts: list[torch.Tensor], feats: list[torch.Tensor]) -> torch.Tensor:
        """xs [T_i, latent], ts 0-d, feats [T_i, feature] -> v [N, max T_i, latent] (row i valid to T_i)."""
        lengths = [x.shape[0] for x in xs]
        static = self._static_for(len(xs), max(lengths))
        if static is None:  # eager, one padded forward
            static = self._new_static(len(xs), -(-max(lengths) // self.step) * self.step)
        self._fill(static, xs, ts, feats, lengths)
        if static.graph is not None:
            static.graph.replay()
            self.replays += 1
            return static.out[:len(xs)].clone()  # solvers keep velocities: the next replay rewrites out
        return self._forward(static)[:len(xs)]

    def capture_all(self) -> int:
        """Every (rows, frames) bucket's graph, largest first (later ones reuse its memory pool)."""
        if not self.graphs_on:
            return 0
        began = time.monotonic()
        for key in [(r, f) for r in reversed(self.row_sizes) for f in reversed(self.frame_sizes)]:
            if not self._capture(key) and self.disabled is not None:
                break
        self.capture_seconds = time.monotonic() - began
        return sum(s.graph is not None for s in self.statics.values())

    def stats(self) -> dict[str, Any]:
        return {"velocity_graphs": sum(s.graph is not None for s in self.statics.values()),
                "velocity_graph_replays": self.replays, "velocity_graphs_disabled": self.disabled}

    # ---- internals --------------------------------------------------------------------
    def _static_for(self, rows: int, frames: int) -> _Static | None:
        if not self.graphs_on or self.disabled is not None:
            return None
        r = next((b for b in self.row_sizes if b >= rows), None)
        f = next((b for b in self.frame_sizes if b >= frames), None)
        return None if r is None or f is None else self.statics.get((r, f))  # only captured ones are kept

    def _new_static(self, rows: int, frames: int) -> _Static:
        m, dev = self.model, self.device
        width = m.feature_dim
        return _Static(x=torch.zeros(rows, frames, m.latent_dim, device=dev),
                       t=torch.zeros(rows, device=dev),
                       feats=torch.zeros(rows, frames, width, dtype=m.feature_dtype, device=dev),
                       lengths=torch.full((rows,), frames, dtype=torch.long, device=dev))

    @staticmethod
    def _fill(static: _Static, xs, ts, feats, lengths: list[int]) -> None:
        n = len(xs)
        for i, (x, f) in enumerate(zip(xs, feats)):
            static.x[i, :x.shape[0]].copy_(x)
            static.feats[i, :f.shape[0]].copy_(f)
        static.t[:n].copy_(torch.stack(ts))
        static.lengths[:n].copy_(torch.tensor(lengths), non_blocking=True)
        static.lengths[n:].fill_(static.x.shape[1])

    def _forward(self, static: _Static) -> torch.Tensor:
        with torch.inference_mode():
            return self.model.velocity(static.x, static.t, static.feats, static.lengths)

    def _capture(self, key: tuple[int, int]) -> bool:
        """False when the bucket stays eager: out of memory (that bucket only), or a kernel that cannot
        be captured (every bucket: `disabled`)."""
        from omni.layers.graph_capture import capture_graph

        try:
            static = self._new_static(*key)
            static.graph, static.out = capture_graph(lambda: self._forward(static), self.device, self.pool)
        except torch.cuda.OutOfMemoryError:
            log.warning("velocity CUDA graph (rows, frames) %s: out of memory, that bucket runs eagerly", key)
            return False
        except Exception as exc:
            self.disabled = f"{type(exc).__name__}: {exc}"
            log.warning("velocity CUDA-graph capture failed, forwards run eagerly: %s", self.disabled)
            torch.cuda.current_stream(self.device).synchronize()
            return False
        self.pool = static.graph.pool()
        self.statics[key] = static
        return True
