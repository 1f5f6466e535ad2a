"""Every running window's ODE state in one set of device tensors, advanced by one fixed-shape step.

Each window the diffusion stage solves sits in a slot: its state y and this interval's velocities
ks (float32), its conditional and null features, its length in frames. A step evaluates the rows
[0, rows) of the slots at frames [0, frames): each row's point (the solver's candidate for its own
sub-step), one forward of the conditional rows and their null rows (a window's real frames never
see its padding: the model's `velocity` takes each row's length), guidance, the velocity stored as
the row's k, and at an interval's last stage the update. The host sends only each row's (t, h,
stage, scale) a step, in one copy. On CUDA each (rows, frames) bucket's step is a CUDA graph
captured at start-up, so a step costs one replay whatever the number of windows (eagerly, a
22-block DiT forward is ~1,000 kernels, 62 ms of host a step on an H200; with per-window solver
and guidance ops on top, 16 windows took 35 ms a step: bench/RESULTS.md "2026-12-04 (later)"). Rows of free
slots inside [0, rows) compute on finite stale values; their results stay in their own slots.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from omni.layers.graph_capture import capture_graph
from omni.stages.ar.cuda_graphs import batch_buckets

log = logging.getLogger("omni.diffusion_batch")

T, H, STAGE, SCALE = range(4)  # the columns of a step's per-row parameters
RING = 8  # pinned parameter buffers in turn


class WindowBatch:
    """`model`: a `DiffusionModel` (omni/stages/diffusion.py); `solver`: an ode.py solver class;
    `slots`: windows at once; `frames`: the longest window (graphs for multiples of the model's
    `pad_frames` up to it; a longer window grows the slots and runs eagerly)."""

    def __init__(self, model, solver: type, slots: int, frames: int, cuda_graphs: bool) -> None:
        self.model, self.solver, self.slots = model, solver, slots
        self.step_frames = int(model.pad_frames)
        self.device = torch.device(model.device)
        self.row_sizes = batch_buckets(slots)
        self.frame_sizes = list(range(self.step_frames, _round_up(frames, self.step_frames) + 1, self.step_frames))
        self.graphs_on = cuda_graphs and self.device.type == "cuda" and bool(frames)
        self.graphs: dict[tuple[int, int], Any] = {}
        self.pool = None
        self.disabled: str | None = None
        self.replays = 0
        self.capture_seconds = 0.0
        self._allocate(_round_up(max(frames, 1), self.step_frames))
        # each step's per-row parameters go over from one of a ring of pinned buffers, reused once the copy
        # from it ran (a fresh pinned tensor a step would allocate page-locked memory while the GPU is behind)
        on_cuda = self.device.type == "cuda"
        self.ring = [torch.zeros(slots, 4, dtype=torch.float32, pin_memory=on_cuda) for _ in range(RING)]
        self.ring_events: list[Any] = [None] * RING
        self.ticks = 0

    def _allocate(self, frames: int) -> None:
        m, dev, s = self.model, self.device, self.slots
        self.frames = frames
        self.y = torch.zeros(s, frames, m.latent_dim, device=dev)
        self.ks = torch.zeros(self.solver.stages, s, frames, m.latent_dim, device=dev)
        self.feats = torch.zeros(2, s, frames, m.feature_dim, dtype=m.feature_dtype, device=dev)  # conditional, null
        self.lengths = torch.ones(s, dtype=torch.long, device=dev)
        self.params = torch.zeros(s, 4, dtype=torch.float32, device=dev)

    # ---- slots ------------------------------------------------------------------------
    def seat(self, slot: int, x0: torch.Tensor, feats: torch.Tensor, null: torch.Tensor | None) -> None:
        """A window into `slot`: its noise x0 [n, latent], features [n, F] (null: None = unguided)."""
        n = x0.shape[0]
        if n > self.frames:
            self._grow(n)
        self.y[slot, :n].copy_(self._pinned(x0), non_blocking=True)
        self.y[slot, n:].zero_()
        self.feats[0, slot, :n].copy_(feats)
        if null is None:
            self.feats[1, slot, :n].zero_()
        else:
            self.feats[1, slot, :n].copy_(null)
        self.feats[:, slot, n:].zero_()
        self.lengths[slot].fill_(n)

    def value(self, slot: int, lo: int, hi: int) -> torch.Tensor:
        """The slot's state at frames [lo, hi), copied (the slot is reused)."""
        return self.y[slot, lo:hi].clone()

    def _grow(self, frames: int) -> None:
        old = (self.y, self.ks, self.feats, self.lengths, self.params)
        self._allocate(_round_up(frames, self.step_frames))
        f = old[0].shape[1]
        self.y[:, :f].copy_(old[0])
        self.ks[:, :, :f].copy_(old[1])
        self.feats[:, :, :f].copy_(old[2])
        self.lengths.copy_(old[3])
        if self.graphs:
            log.warning("diffusion: a window of %d frames outgrew the slots; steps run eagerly", frames)
        self.graphs, self.graphs_on = {}, False

    # ---- stepping ---------------------------------------------------------------------
    def step(self, rows: np.ndarray, frames: int) -> None:
        """One evaluation for the slots [0, len(rows)): rows [R, 4] float32 (t, h, stage, scale;
        a free slot's row all zeros), the longest of their windows `frames`."""
        n = rows.shape[0]
        key = self._key(n, frames)
        r = key[0] if key in self.graphs else n
        self._send_params(rows, r)
        if key in self.graphs:
            self.graphs[key].replay()
            self.replays += 1
        else:
            self._body(r, min(self.frames, _round_up(frames, self.step_frames)) if self.graphs_on else frames)

    def _send_params(self, rows: np.ndarray, r: int) -> None:
        """rows [n, 4] (zeros after them up to r) into `params` without waiting for the GPU."""
        i = self.ticks % RING
        self.ticks += 1
        if self.ring_events[i] is not None:
            self.ring_events[i].synchronize()  # the copy from this buffer RING steps ago (long done)
        buf = self.ring[i][:r]
        buf.zero_()
        buf[:rows.shape[0]] = torch.from_numpy(rows)
        self.params[:r].copy_(buf, non_blocking=True)
        if self.device.type == "cuda":
            self.ring_events[i] = torch.cuda.Event()
            self.ring_events[i].record(torch.cuda.current_stream(self.device))

    def _pinned(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor in pinned memory from torch's caching host allocator: the block is not reused
        before the copy from it ran, so the host never waits for the GPU to take its input."""
        return t.pin_memory() if self.device.type == "cuda" and t.device.type == "cpu" else t

    def _key(self, rows: int, frames: int) -> tuple[int, int] | None:
        r = next((b for b in self.row_sizes if b >= rows), None)
        f = next((b for b in self.frame_sizes if b >= frames), None)
        return None if r is None or f is None else (r, f)

    @torch.inference_mode()
    def _body(self, rows: int, frames: int) -> None:
        """What a graph records: the step over slots [0, rows), frames [0, frames)."""
        p = self.params[:rows]
        h, scale = p[:, H].view(rows, 1, 1), p[:, SCALE].view(rows, 1, 1)
        stage = p[:, STAGE].long()
        y, ks = self.y[:rows, :frames], self.ks[:, :rows, :frames]
        x = self.solver.points(y, ks, h, stage)
        lengths = self.lengths[:rows]
        v = self.model.velocity(torch.cat([x, x]), torch.cat([p[:, T], p[:, T]]),
                                self.feats[:, :rows, :frames].reshape(2 * rows, frames, -1),
                                torch.cat([lengths, lengths]))
        vc, vn = v[:rows], v[rows:]
        ks[stage, torch.arange(rows, device=stage.device)] = vc + (vc - vn) * scale
        last = (stage == self.solver.stages - 1).view(rows, 1, 1)
        y.copy_(torch.where(last, self.solver.update(y, ks, h), y))

    def capture_all(self) -> int:
        """Every (rows, frames) bucket's graph, largest first (later ones reuse its memory pool)."""
        if not self.graphs_on:
            return 0
        began = time.monotonic()
        saved = [t.clone() for t in (self.y, self.ks)]
        for key in [(r, f) for r in reversed(self.row_sizes) for f in reversed(self.frame_sizes)]:
            if not self._capture(key) and self.disabled is not None:
                break
        self.y.copy_(saved[0])  # captures ran the step on whatever the slots held
        self.ks.copy_(saved[1])
        self.capture_seconds = time.monotonic() - began
        return len(self.graphs)

    def _capture(self, key: tuple[int, int]) -> bool:
        """False when the bucket stays eager: out of memory (that bucket only), or a kernel that cannot
        be captured (every bucket: `disabled`)."""
        try:
            graph, _ = capture_graph(lambda: self._body(*key), self.device, self.pool)
        except torch.cuda.OutOfMemoryError:
            log.warning("diffusion step CUDA graph (rows, frames) %s: out of memory, that bucket runs eagerly", key)
            return False
        except Exception as exc:
            self.disabled = f"{type(exc).__name__}: {exc}"
            self.graphs_on = False
            log.warning("diffusion step CUDA-graph capture failed, steps run eagerly: %s", self.disabled)
            torch.cuda.current_stream(self.device).synchronize()
            return False
        self.pool = graph.pool()
        self.graphs[key] = graph
        return True

    def stats(self) -> dict[str, Any]:
        return {"step_graphs": len(self.graphs), "step_graph_replays": self.replays,
                "step_graphs_disabled": self.disabled}


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step
