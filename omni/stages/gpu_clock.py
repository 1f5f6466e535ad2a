"""The GPU's share of a stage's steps, from CUDA events: the "gpu" part of the stage timeline.

`start()` before a step's first launch and `stop()` after its last record an event pair on the
device's current stream; a pair is read once its end event has completed (`query`, never a
synchronize), so timing never makes the step wait. A pair spans from the GPU reaching the first
launch to it finishing the last one: with CUDA graphs that is busy time, in eager code it also holds
the gaps where the GPU waited for the host's next launch. Off CUDA every call is a no-op and torch
is not imported: CPU paths run exactly as without it.
"""

from __future__ import annotations

import collections
from typing import Any

MAX_PENDING = 4096  # pairs not yet complete; past it the oldest are dropped rather than waited on


class GpuClock:
    def __init__(self, device: Any = None) -> None:
        self.on = str(device or "cpu").startswith("cuda")
        self.device = device
        self.busy_s = 0.0
        self._open: Any = None
        self._pending: collections.deque = collections.deque()
        self._spare: list[Any] = []
        if self.on:
            import torch

            self._torch = torch

    def start(self) -> None:
        if not self.on or self._torch.cuda.is_current_stream_capturing():
            return
        self._open = self._record()

    def stop(self) -> None:
        """End the pair `start` opened (a no-op when none is open)."""
        begin, self._open = self._open, None
        if begin is None or self._torch.cuda.is_current_stream_capturing():
            return
        self._pending.append((begin, self._record()))
        if len(self._pending) > MAX_PENDING:
            self._spare.extend(self._pending.popleft())
        self._collect()

    def seconds(self) -> float:
        """GPU seconds of every pair that has completed."""
        if self.on:
            self._collect()
        return self.busy_s

    def _record(self) -> Any:
        event = self._spare.pop() if self._spare else self._torch.cuda.Event(enable_timing=True)
        event.record(self._torch.cuda.current_stream(self.device))
        return event

    def _collect(self) -> None:
        while self._pending and self._pending[0][1].query():
            begin, end = self._pending.popleft()
            self.busy_s += begin.elapsed_time(end) / 1e3
            self._spare += (begin, end)
