"""CUDA graphs of the streaming codec decoder: one graph per (batch bucket, frames, trims).

A chunk's decode is ~500 small kernels whose launches cost more than their work (a 12-frame chunk
took ~14 ms alone on an H200, launch-bound), and the vocoder stage runs several such forwards a
step. A graph replays the whole forward - gathering the streams' contexts from their slots,
the decoder, writing the contexts back - in one launch. The batch is padded to its bucket with
rows that read and write the slots' scratch row; codes and each row's (slot, frame count) are
copied into the graph's inputs first. Shapes that were not captured run eagerly.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from omni.layers.graph_capture import capture_graph  # the one recipe: inline stages capture at once

log = logging.getLogger("omni.codec.graphs")

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


def frame_sizes(first: int, chunk: int) -> tuple[int, ...]:
    """The chunk lengths worth a graph: the first chunk, the later one, and the powers of two
    below it (a stream's growing chunks and its last chunk, split into these, all replay)."""
    sizes = {first, chunk}
    n = 1
    while n < chunk:
        sizes.add(n)
        n *= 2
    return tuple(sorted(sizes))


@dataclass
class _Graph:
    replay: Callable[[], None]
    codes: torch.Tensor  # [bucket, groups, frames] long
    meta: torch.Tensor  # [2, bucket] long: slot rows, frame counts
    out: torch.Tensor  # [bucket, samples] float32
    consumed: dict[str, int]


class CodecGraphs:
    """`run(codes, meta, trim)` -> (pcm, consumed): the decoder's gather -> forward -> scatter
    (the `step` callable) on graph inputs. `capture` records the shapes a stream will meet;
    `record` is the one CUDA-specific part."""

    def __init__(self, step: Callable, groups: int, device: torch.device) -> None:
        self.step = step
        self.groups = groups
        self.device = device
        self.graphs: dict[tuple, _Graph] = {}
        self.pool = None
        self.generation = -1
        self.replays = 0

    def bucket(self, batch: int) -> int | None:
        return next((b for b in BATCH_BUCKETS if b >= batch), None)

    def capture(self, keys: list[tuple[int, int, tuple]], generation: int) -> float:
        """Record a graph per (bucket, frames, trim items), largest first (they share one memory
        pool). Returns the seconds it took."""
        t0 = time.monotonic()
        self.graphs.clear()
        self.generation = generation
        for bucket, frames, trim in sorted(keys, key=lambda k: (-k[0], -k[1])):
            codes = torch.zeros(bucket, self.groups, frames, dtype=torch.long, device=self.device)
            meta = torch.zeros(2, bucket, dtype=torch.long, device=self.device)  # every row: scratch
            replay, out, consumed = self.record(codes, meta, dict(trim))
            self.graphs[(bucket, frames, trim)] = _Graph(replay, codes, meta, out, consumed)
        return time.monotonic() - t0

    def record(self, codes: torch.Tensor, meta: torch.Tensor, trim: dict[str, int]):
        """One CUDA graph of `step` on these inputs -> (replay, its output, consumed)."""
        graph, (out, consumed) = capture_graph(lambda: self.step(codes, meta, trim), self.device, self.pool)
        self.pool = graph.pool()
        return graph.replay, out, consumed

    def has(self, batch: int, frames: int, trim: dict[str, int]) -> bool:
        bucket = self.bucket(batch)
        return bucket is not None and (bucket, frames, tuple(sorted(trim.items()))) in self.graphs

    def frames_captured(self) -> set[int]:
        return {frames for _, frames, _ in self.graphs}

    def run(self, codes: torch.Tensor, meta: torch.Tensor, trim: dict[str, int]) -> tuple[torch.Tensor, dict[str, int]]:
        """codes [B, groups, T] and meta [2, B] on the device (meta may still be in flight from a
        pinned copy): one replay; the PCM is copied out of the graph's pool."""
        batch = codes.shape[0]
        g = self.graphs[(self.bucket(batch), codes.shape[-1], tuple(sorted(trim.items())))]
        g.codes[:batch].copy_(codes)
        g.meta[:, :batch].copy_(meta)
        g.meta[:, batch:].zero_()  # padding rows: the scratch slot, frame 0
        g.replay()
        self.replays += 1
        return g.out[:batch].clone(), g.consumed
