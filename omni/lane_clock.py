"""Where one event loop's wall time goes, lane by lane: the stage timeline's clock.

A stage actor's mailbox loop is always in exactly one lane: its base lane (its own work: sending
outputs and credits) or a lane it is waiting in (for input, for the compute thread, for credits).
Each switch charges the time since the last one to the lane it leaves, so the lanes add up to the
wall time since the clock started, and a switch costs one `perf_counter` call. Side counters
(`timed`) hold time spent elsewhere on the same thread, such as handling inbound messages, which
happens while the loop waits in some lane: they overlap the lanes. Plain Python (the kernel uses
it); it lives outside omni/kernel for the kernel's line budget, as omni/placement.py does.
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable, TypeVar

T = TypeVar("T")


class LaneClock:
    def __init__(self, base: str, lanes: tuple[str, ...] = ()) -> None:
        self.lanes = dict.fromkeys((base, *lanes), 0.0)  # lane -> seconds, charged up to the last switch
        self.side: dict[str, float] = {}
        self._lane, self._since = base, time.perf_counter()

    def enter(self, lane: str) -> str:
        """Switch to `lane`; returns the lane left."""
        now = time.perf_counter()
        self.lanes[self._lane] = self.lanes.get(self._lane, 0.0) + now - self._since
        left, self._lane, self._since = self._lane, lane, now
        return left

    async def wait(self, lane: str, awaitable: Awaitable[T]) -> T:
        """Await in `lane`, then go back to the lane the loop was in."""
        left = self.enter(lane)
        try:
            return await awaitable
        finally:
            self.enter(left)

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` with the time of each call added to the side counter `name`."""
        self.side.setdefault(name, 0.0)

        def call(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.side[name] += time.perf_counter() - t0

        return call

    def seconds(self) -> dict[str, float]:
        """Every lane's seconds up to now (the lane running now included) and the side counters."""
        self.enter(self._lane)
        return {**self.lanes, **self.side}

    def merged(self, stats: dict) -> dict:
        """A driver's `stats` with `time_s` holding its own parts (e.g. "gpu"), the compute thread's
        `step` seconds and these lanes."""
        return {**stats, "time_s": {**stats.get("time_s", {}), "step": stats["step_seconds"], **self.seconds()}}
