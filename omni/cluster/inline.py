"""Library mode's host ("inline"): each replica an asyncio task in the kernel's own loop and process.

It has the interface of the other hosts (omni/cluster/local.py), `spawn(config, spec)` returning a
process handle (`pid`, `poll`, `reason`, `kill`, `stop`), so the supervisor keeps one path for
every mode: a crash here is the task cancelled, its pid the kernel's own. The actors share the
kernel's `Graph` object (the config's copy of it is not used).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from omni.gpu_env import keep_multicast_off


class InlineProcess:
    """One replica's Actor running as a task of this loop."""

    def __init__(self, actor: Any, name: str) -> None:
        self.actor, self.pid = actor, os.getpid()
        self.task = asyncio.create_task(actor.run(), name=f"omni-{name}")

    def poll(self) -> int | None:
        """None while the task runs, else 0."""
        return None if not self.task.done() else 0

    def reason(self) -> str:
        if self.task.done() and not self.task.cancelled():
            exc = self.task.exception()
            return f"task ended: {exc!r}" if exc else "task ended"
        return "stopped"

    def kill(self) -> None:
        """As a crash would: the task is cancelled."""
        self.task.cancel()

    async def stop(self, timeout_s: float) -> None:
        """Tell the actor to stop; cancel its task if it has not ended within `timeout_s`."""
        self.actor.stop()
        try:
            await asyncio.wait_for(self.task, timeout_s)
        except (asyncio.TimeoutError, asyncio.CancelledError, Exception):
            self.task.cancel()


class InlineHost:
    """Replicas of `graph`'s stages as tasks here; `bus_host` as the other hosts' (the kernel's mailbox)."""

    def __init__(self, graph: Any, bus_host: str = "") -> None:
        self.graph, self.bus_host = graph, bus_host

    def spawn(self, config: dict[str, Any], spec: Any) -> InlineProcess:
        from omni.kernel.actor import Actor

        keep_multicast_off()  # the stage runs in this process
        actor = Actor(self.graph, config["stage"], config["replica"], config["run_dir"], config["instance"])
        return InlineProcess(actor, f"{config['stage']}.{config['replica']}")
