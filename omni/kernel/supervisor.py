"""Starting, watching and restarting stage actors: one_for_one with a restart budget, as in OTP.

A replica runs as a process its host spawns (here, or on a Ray node: omni/cluster) or, in library
mode ("inline"), as an asyncio task in the kernel's loop (omni/cluster/inline.py, a host as well);
all report through the same messages (ActorReady or ActorFailed, then heartbeats). Death is seen by
the exit status or the task's end, a stalled mailbox by missing heartbeats. The supervisor tells the kernel (which fails the requests that replica held), frees what the replica
owned and restarts it after a backoff; past `max_restarts` within `restart_window_s` the replica is
down and rests `restart_cooldown_s` before it is tried afresh.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omni.cluster.addresses import learn, peers
from omni.cluster.inline import InlineHost
from omni.cluster.local import LocalHost
from omni.kernel import messages as m
from omni.kernel.bus import Outbox
from omni.kernel.errors import StageStartError
from omni.kernel.graph import Graph
from omni.kernel.registry import STAGES
from omni.kernel.rundir import actor_name, remove_socket, shm_owner
from omni.transport.channels import release_leftovers

log = logging.getLogger("omni.supervisor")


class ActorState(Enum):
    STARTING = "starting"
    UP = "up"
    RESTARTING = "restarting"
    DOWN = "down"
    STOPPED = "stopped"


@dataclass
class ReplicaCounts:
    """What happened to one replica since the kernel started; each only ever grows (Prometheus counters)."""
    restarts_total: int = 0  # launches after a death
    restart_failures_total: int = 0  # of those, the ones that did not come up
    cooldowns_total: int = 0  # times it went past its restart budget and rested `restart_cooldown_s`


@dataclass
class ActorHandle:
    """One replica as the supervisor sees it."""
    stage: str
    replica: int
    state: ActorState = ActorState.STARTING
    process: Any = None  # its host's handle (omni/cluster/local.py: LocalProcess; inline.py: InlineProcess)
    ready: asyncio.Future | None = None
    last_heartbeat: float = 0.0
    last_stats: dict[str, Any] = field(default_factory=dict)
    restarts: list[float] = field(default_factory=list)  # when it was restarted, within the window
    pid: int = 0
    counts: "ReplicaCounts" = field(default_factory=lambda: ReplicaCounts())

    @property
    def name(self) -> str:
        return actor_name(self.stage, self.replica)

    @property
    def live_pid(self) -> int:
        """The PID of a replica that is up, else 0 (a process being restarted or resting has none to show)."""
        return self.pid if self.state is ActorState.UP else 0

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_reason(self) -> str:
        return self.process.reason() if self.process is not None else "stopped"

    def kill(self) -> None:
        """As a crash would: SIGKILL, or cancelling the task inline."""
        if self.process is not None:
            self.process.kill()


class Supervisor:
    """Owns every replica's lifecycle. `on_death(handle, reason)` fails the requests the replica
    held and returns their ids, which the restarted replica is told to drop."""

    def __init__(self, graph: Graph, mode: str, instance: str, on_death: Callable[[ActorHandle, str], list[str]],
                 heartbeat_timeout_s: float, log_level: str, env: dict[str, str], host: Any = None) -> None:
        if mode not in ("process", "inline"):
            raise ValueError(f"mode must be 'process' or 'inline', not {mode!r}")
        self.graph, self.mode, self.instance, self._on_death = graph, mode, instance, on_death
        # inline, the kernel's mailbox still binds where a given host's bus runs
        self.host = InlineHost(graph, getattr(host, "bus_host", "")) if mode == "inline" else host or LocalHost()
        self.heartbeat_timeout_s, self.log_level, self.env = heartbeat_timeout_s, log_level, env
        self.handles = {h.name: h for h in (ActorHandle(s.name, r) for s in graph.stages for r in range(s.replicas))}
        self.restarts_total: dict[str, int] = {s.name: 0 for s in graph.stages}
        self._tasks: list[asyncio.Task] = []
        self._closed = False

    async def start(self, run_dir: str, outbox: Outbox) -> None:
        """Launch every replica and wait until all are ready; raises StageStartError naming one that is not."""
        self.run_dir, self.outbox = run_dir, outbox
        for handle in self.handles.values():
            self._launch(handle)
        await asyncio.gather(*(self._await_ready(h) for h in self.handles.values()))
        self._tasks.append(asyncio.create_task(self._watch()))

    def on_report(self, msg: m.ActorReady | m.ActorFailed | m.ActorHeartbeat) -> None:
        if (handle := self.handles.get(actor_name(msg.stage, msg.replica))) is None:
            return
        if isinstance(msg, m.ActorHeartbeat):
            handle.last_heartbeat, handle.last_stats = time.monotonic(), msg.stats
        elif handle.ready is not None and not handle.ready.done():
            if isinstance(msg, m.ActorReady):
                handle.pid = msg.pid
                learn(self.run_dir, handle.name, msg.address, msg.node)
                self.outbox.reset(handle.name)  # a restarted replica may listen elsewhere now
                self._announce(handle)
                handle.ready.set_result(True)
            else:
                handle.ready.set_exception(StageStartError(f"stage {handle.name} failed to start: {msg.error}"))

    def health(self) -> dict[str, str]:
        """Per stage: "up" only when every replica is up, else the worst replica state."""
        order = [ActorState.DOWN, ActorState.RESTARTING, ActorState.STARTING, ActorState.STOPPED, ActorState.UP]
        worst: dict[str, ActorState] = {}
        for h in self.handles.values():
            worst[h.stage] = min(worst.get(h.stage, ActorState.UP), h.state, key=order.index)
        return {stage: state.value for stage, state in worst.items()}

    async def stop(self) -> None:
        """Tell every replica to shut down; terminate, then kill, the ones that do not."""
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for handle in self.handles.values():
            if handle.alive():
                self.outbox.send(handle.name, m.ActorShutdown())
        # Running actors get time to shut down cleanly; ones still starting (whose mailbox is not
        # open yet) are terminated at once, so a failed start does not wait for slow siblings.
        await asyncio.gather(*(self._stop(h, 5.0 if h.state is ActorState.UP else 0.1) for h in self.handles.values()))
        for handle in self.handles.values():
            self._release(handle)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _launch(self, handle: ActorHandle) -> None:
        handle.ready = asyncio.get_running_loop().create_future()
        handle.state = ActorState.RESTARTING if handle.restarts else ActorState.STARTING
        handle.last_heartbeat = time.monotonic()
        config = {"graph": self.graph.to_dict(), "stage": handle.stage, "replica": handle.replica,
                  "run_dir": self.run_dir, "instance": self.instance, "parent_pid": os.getpid(),
                  "log_level": self.log_level, "env": self.env,
                  "stage_kinds": STAGES.entries_for([s.kind for s in self.graph.stages])}
        handle.process = self.host.spawn(config, self.graph.stage(handle.stage))
        handle.pid = handle.process.pid

    def _announce(self, handle: ActorHandle) -> None:
        """Tell every other replica that `handle` (re)started and where it listens; across hosts, tell it
        where the others listen (its ActorReady is the first the kernel heard of its address)."""
        address, node = (book := peers(self.run_dir)).get(handle.name, ("", ""))
        for other in (h for h in self.handles.values() if h is not handle):
            self.outbox.send(other.name, m.PeerUpdate(handle.stage, handle.replica, address, node))
            if other.name in book:
                self.outbox.send(handle.name, m.PeerUpdate(other.stage, other.replica, *book[other.name]))

    async def _await_ready(self, handle: ActorHandle) -> None:
        timeout_s = self.graph.stage(handle.stage).start_timeout_s
        deadline = time.monotonic() + timeout_s
        while not handle.ready.done():
            if not handle.alive():
                await asyncio.sleep(0.5)  # its last words (ActorFailed: why) may still be on the way
                if not handle.ready.done():
                    raise StageStartError(f"stage {handle.name} failed to start: {handle.exit_reason()} "
                                          "before it was ready")
            elif time.monotonic() > deadline:
                handle.kill()
                raise StageStartError(f"stage {handle.name} failed to start: not ready within {timeout_s:g} s")
            else:
                await asyncio.sleep(0.02)
        handle.ready.result()  # raises the StageStartError an ActorFailed set
        handle.state = ActorState.UP

    async def _stop(self, handle: ActorHandle, timeout_s: float) -> None:
        handle.state = ActorState.STOPPED
        if handle.process is not None:
            await handle.process.stop(timeout_s)

    def _release(self, handle: ActorHandle) -> None:
        """Unlink the shm the replica owned (and its process's channel files: none inline, the kernel's own)."""
        release_leftovers(self.graph, shm_owner(self.instance, handle.stage, handle.replica),
                          handle.pid if handle.process is not None and self.mode == "process" else 0)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            for handle in [h for h in self.handles.values() if h.state is ActorState.UP]:
                silent_s = time.monotonic() - handle.last_heartbeat
                if not handle.alive():
                    await self._died(handle, handle.exit_reason())
                elif silent_s > self.heartbeat_timeout_s:
                    log.error("stage %s missed heartbeats for %.1f s; killing it", handle.name, silent_s)
                    handle.kill()

    async def _died(self, handle: ActorHandle, reason: str) -> None:
        """Fail what it held, free what it owned, and restart it: after a backoff of 0.2 s doubling per
        restart within the window, or, past the budget, after the cool-down and afresh (a rate, as in OTP)."""
        log.error("stage %s died (%s)", handle.name, reason)
        spec = self.graph.stage(handle.stage)
        handle.state = ActorState.RESTARTING
        victims = self._on_death(handle, reason)
        self._release(handle)
        remove_socket(self.run_dir, handle.name)
        self.outbox.reset(handle.name)  # drop what was queued for the dead process
        now = time.monotonic()
        handle.restarts = [t for t in handle.restarts if now - t < spec.restart_window_s]
        afresh = len(handle.restarts) >= spec.max_restarts
        if afresh:
            handle.state = ActorState.DOWN
            handle.counts.cooldowns_total += 1
            log.error("stage %s is down: %d restarts within %g s; retrying in %g s", handle.name,
                      len(handle.restarts), spec.restart_window_s, spec.restart_cooldown_s)
        delay = spec.restart_cooldown_s if afresh else min(0.2 * 2 ** len(handle.restarts), 5.0)
        self._tasks.append(asyncio.create_task(self._restart(handle, delay, victims, afresh)))

    async def _restart(self, handle: ActorHandle, delay: float, victims: list[str], afresh: bool) -> None:
        await asyncio.sleep(delay)
        if self._closed:
            return
        if afresh:
            handle.restarts.clear()
        handle.restarts.append(time.monotonic())
        self.restarts_total[handle.stage] += 1
        handle.counts.restarts_total += 1
        self._launch(handle)
        try:
            await self._await_ready(handle)
        except StageStartError as exc:
            handle.counts.restart_failures_total += 1
            log.error("restart failed: %s", exc)
            return await self._died(handle, str(exc))
        for rid in victims:
            self.outbox.send(handle.name, m.RequestCancel(rid))
        log.warning("stage %s restarted", handle.name)
