"""The microkernel: starts the graph's actors, admits requests, routes their entry and exit.

The kernel is not on the data path between stages (actors push to each other directly); it
sends each request's Open to the entry stage, receives what flows into `$out`, broadcasts
cancels, and supervises the actors (see `supervisor.py`).

    kernel = Kernel(graph, mode="process")      # or "inline": same actors as asyncio tasks
    await kernel.start()
    async for event in kernel.submit({"prompt": "hi"}):
        ...
    await kernel.stop()
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from typing import Any

import msgspec

from omni.kernel import messages as m
from omni.kernel.actor import KERNEL, edge_channel, pick_replica
from omni.kernel.bus import Mailbox, Outbox
from omni.kernel.channels import cleanup_dead_process, load_channel
from omni.kernel.errors import (
    DeadlineExceeded,
    GraphError,
    KernelClosed,
    OmniError,
    Overloaded,
    RequestCancelled,
    StageDown,
    StageFailed,
    StageStartError,
    error_from_kind,
)
from omni.kernel.graph import Graph
from omni.kernel.requests import InflightRequest, OutputEvent, RequestState, RequestStream, end_marker
from omni.kernel.routing import Route, Router
from omni.kernel.rundir import (
    actor_name,
    endpoint,
    make_run_dir,
    new_instance_id,
    remove_run_dir,
    remove_socket,
    shm_owner,
    unlink_shm_prefix,
)
from omni.kernel.supervisor import ActorHandle, ActorState, Launcher, restart_delay

log = logging.getLogger("omni.kernel")

ENTRY_EDGE = "$in.in->{entry}.in"


class Kernel:
    def __init__(
        self,
        graph: Graph,
        mode: str = "process",
        max_inflight: int = 64,
        heartbeat_timeout_s: float = 30.0,
        log_level: str = "WARNING",
        env: dict[str, str] | None = None,
    ) -> None:
        graph.validate()
        for spec in graph.stages:
            if "." in spec.name or "$" in spec.name:
                raise GraphError(f"stage name {spec.name!r} may not contain '.' or '$'")
        self.graph = graph
        self.mode = mode
        self.max_inflight = max_inflight
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.instance = new_instance_id()
        self.run_dir = ""
        self._log_level = log_level
        self._env = env or {}
        self._handles: dict[str, ActorHandle] = {}
        self._inflight: dict[str, InflightRequest] = {}
        self._readers: dict[str, Any] = {}
        self._queries: dict[int, dict[str, Any]] = {}
        self._query_ids = itertools.count()
        self._tasks: list[asyncio.Task] = []
        self._started = False
        self._closed = False
        self.restarts_total: dict[str, int] = {s.name: 0 for s in graph.stages}
        try:
            self.router = Router(graph)
        except (ImportError, AttributeError, ValueError) as exc:
            raise GraphError(f"graph {graph.name!r}: cannot load its needs {graph.needs!r}: {exc}") from None

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self.run_dir = str(make_run_dir(self.instance))
        self.mailbox = Mailbox(endpoint(self.run_dir, KERNEL), self._on_frames, KERNEL)
        self.outbox = Outbox(lambda peer: endpoint(self.run_dir, peer), KERNEL)
        self.mailbox.start()
        self._launcher = Launcher(self.graph, self.mode, self.run_dir, self.instance, self._log_level, self._env)
        for spec in self.graph.stages:
            for replica in range(spec.replicas):
                handle = ActorHandle(spec.name, replica)
                self._handles[handle.name] = handle
        for handle in self._handles.values():
            self._launcher.launch(handle)
        try:
            await asyncio.gather(*(self._await_ready(h) for h in self._handles.values()))
        except StageStartError:
            await self.stop()
            raise
        self._tasks.append(asyncio.create_task(self._supervise()))
        self._started = True

    async def _await_ready(self, handle: ActorHandle) -> None:
        spec = self.graph.stage(handle.stage)
        deadline = time.monotonic() + spec.start_timeout_s
        while not handle.ready.done():
            if not handle.alive():
                await asyncio.sleep(0.5)  # its last words (ActorFailed: why) may still be on the way
                if not handle.ready.done():
                    raise StageStartError(f"stage {handle.name} failed to start: {handle.exit_reason()} "
                                          "before it was ready")
                break
            if time.monotonic() > deadline:
                self._launcher.kill(handle)
                raise StageStartError(f"stage {handle.name} failed to start: not ready within {spec.start_timeout_s:g} s")
            await asyncio.sleep(0.02)
        handle.ready.result()  # raises the StageStartError an ActorFailed set
        handle.state = ActorState.UP

    async def stop(self) -> None:
        """Stop every actor; leaves no process, socket file or shm segment behind."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for rid in list(self._inflight):
            self._finish(rid, KernelClosed("the kernel is shutting down"))
        for handle in self._handles.values():
            if handle.alive():
                self._send(handle.name, m.ActorShutdown("kernel stop"))
        # Running actors get time to shut down cleanly; ones still starting (whose mailbox is not
        # open yet) are terminated at once, so a failed start does not wait for slow siblings.
        await asyncio.gather(*(self._launcher.stop(h, 5.0 if h.state is ActorState.UP else 0.1)
                               for h in self._handles.values()))
        for handle in self._handles.values():
            if handle.process is not None:
                cleanup_dead_process(self._channels_in_use(), handle.pid)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.outbox.close()
        self.mailbox.close()
        for reader in self._readers.values():
            reader.close()
        unlink_shm_prefix(f"omni-{self.instance}-")
        remove_run_dir(self.run_dir)

    async def __aenter__(self) -> Kernel:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # ---- requests -----------------------------------------------------------------------

    def submit(self, params: dict[str, Any], rid: str | None = None, deadline_s: float | None = None) -> RequestStream:
        """Admit a request; raises Overloaded when `max_inflight` requests are running."""
        if self._closed or not self._started:
            raise KernelClosed("the kernel is not running")
        if len(self._inflight) >= self.max_inflight:
            raise Overloaded(f"{len(self._inflight)} requests in flight (limit {self.max_inflight}); retry later")
        rid = rid or uuid.uuid4().hex
        if rid in self._inflight:
            raise ValueError(f"request id {rid!r} is already in flight")
        route = self._route(params)
        down = [name for name in (self._replica_of(stage, rid) for stage in route.stages)
                if self._handles[name].state is not ActorState.UP]
        if down:  # only the stages this request uses matter: one that skips a down stage is served
            raise StageDown(f"stage(s) not serving: {', '.join(down)}")
        request = InflightRequest(rid, route.exits, holders=set(route.stages))
        self._inflight[rid] = request
        loop = asyncio.get_running_loop()
        deadline = 0.0
        if deadline_s is not None:
            deadline = time.time() + deadline_s
            request.deadline_handle = loop.call_later(
                deadline_s, self._expire, rid, deadline_s
            )
        entry = self.graph.entry
        target = actor_name(entry, pick_replica(rid, self.graph.stage(entry).replicas))
        edge = ENTRY_EDGE.format(entry=entry)
        if not (self._send(target, m.RequestOpen(rid, params, deadline, edge, route.skip))
                and self._send(target, m.RequestEnd(rid, edge))):
            self._finish(rid, StageFailed(f"stage {target} is not reachable"))
        return RequestStream(self, request)

    def _route(self, params: dict[str, Any]) -> Route:
        try:
            return self.router.route(params)
        except Exception as exc:  # a family's `needs` that cannot read these params: use every stage
            log.warning("routing failed (%s: %s); the request uses every stage", type(exc).__name__, exc)
            return Router.everything(self.graph)

    def _replica_of(self, stage: str, rid: str) -> str:
        return actor_name(stage, pick_replica(rid, self.graph.stage(stage).replicas))

    async def cancel(self, rid: str, reason: str = "cancelled by the client") -> None:
        if rid in self._inflight:
            self._finish(rid, RequestCancelled(reason))

    def _expire(self, rid: str, deadline_s: float) -> None:
        if rid in self._inflight:
            self._finish(rid, DeadlineExceeded(f"request {rid} passed its {deadline_s:g} s deadline"))

    def _finish(self, rid: str, error: OmniError | None = None) -> None:
        """End a request for the client; on error, tell every stage to free its state."""
        request = self._inflight.pop(rid, None)
        if request is None:
            return
        if request.deadline_handle is not None:
            request.deadline_handle.cancel()
        if error is None:
            request.state = RequestState.FINISHED
            request.queue.put_nowait(OutputEvent(rid, "", "final", request.final_meta, final=True))
        else:
            request.state = RequestState.FAILED
            request.queue.put_nowait(error)
            self._broadcast_cancel(rid, error.kind)
        request.queue.put_nowait(end_marker())

    def _broadcast_cancel(self, rid: str, reason: str, only: list[str] | None = None) -> None:
        for name in only or list(self._handles):
            if self._handles[name].state in (ActorState.UP, ActorState.STARTING, ActorState.RESTARTING):
                self._send(name, m.RequestCancel(rid, reason))

    # ---- inbound ------------------------------------------------------------------------

    def _on_frames(self, frames: list[Any]) -> None:
        try:
            self._dispatch(m.decode(frames[0].buffer), frames[1:])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("kernel dropped a malformed message: %s", exc)

    def _dispatch(self, msg: m.AnyMsg, frames: list[Any]) -> None:
        match msg:
            case m.RequestChunk():
                self._on_output(msg, frames)
            case m.RequestEnd():
                request = self._inflight.get(msg.rid)
                if request is not None:
                    request.final_meta.update(msg.meta)
                    request.pending_exits.discard(msg.edge)
                    if not request.pending_exits:
                        self._finish(msg.rid)
            case m.RequestLeft():
                request = self._inflight.get(msg.rid)
                if request is not None:
                    request.holders.discard(msg.stage)
            case m.RequestError():
                if msg.rid in self._inflight:
                    self._finish(msg.rid, error_from_kind(msg.kind, f"stage {msg.stage}: {msg.message}"))
            case m.ActorReady():
                handle = self._handles.get(actor_name(msg.stage, msg.replica))
                if handle is not None and handle.ready is not None and not handle.ready.done():
                    handle.pid = msg.pid
                    handle.ready.set_result(True)
            case m.ActorFailed():
                handle = self._handles.get(actor_name(msg.stage, msg.replica))
                if handle is not None and handle.ready is not None and not handle.ready.done():
                    handle.ready.set_exception(StageStartError(f"stage {handle.name} failed to start: {msg.error}"))
            case m.ActorHeartbeat():
                handle = self._handles.get(actor_name(msg.stage, msg.replica))
                if handle is not None:
                    handle.last_heartbeat = time.monotonic()
                    handle.last_stats = msg.stats
            case m.StatsReply():
                query = self._queries.get(msg.token)
                if query is not None:
                    query[actor_name(msg.stage, msg.replica)] = msg.stats
            case _:
                log.warning("kernel dropped an unexpected %s", type(msg).__name__)

    def _on_output(self, msg: m.RequestChunk, frames: list[Any]) -> None:
        tokens = []
        data = dict(msg.meta)
        for desc in msg.payloads:
            reader = self._readers.get(desc.channel) or self._readers.setdefault(desc.channel, load_channel(desc.channel).reader())
            value = reader.read(desc, frames)
            data[desc.name] = value.clone() if hasattr(value, "clone") else value.copy()
            token = reader.token(desc)
            if token is not None:
                tokens.append(token)
        src, port = msg.edge.split("->", 1)[0].split(".", 1)
        if tokens:  # exit edges have no credit limit; only payload slots need returning
            producer = actor_name(src, pick_replica(msg.rid, self.graph.stage(src).replicas))
            self._send(producer, m.EdgeCredit(msg.edge, 1, tokens, KERNEL))
        request = self._inflight.get(msg.rid)
        if request is not None:
            request.queue.put_nowait(OutputEvent(msg.rid, src, port, data))

    # ---- supervision ------------------------------------------------------------------------

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            for handle in self._handles.values():
                if handle.state is not ActorState.UP:
                    continue
                if not handle.alive():
                    await self._on_death(handle, handle.exit_reason())
                elif now - handle.last_heartbeat > self.heartbeat_timeout_s:
                    log.error("stage %s missed heartbeats for %.1f s; killing it", handle.name, now - handle.last_heartbeat)
                    self._launcher.kill(handle)

    async def _on_death(self, handle: ActorHandle, reason: str) -> None:
        log.error("stage %s died (%s)", handle.name, reason)
        spec = self.graph.stage(handle.stage)
        handle.state = ActorState.RESTARTING
        # only requests that hold state in this stage or still have to pass through it fail
        victims = [rid for rid, request in self._inflight.items()
                   if handle.stage in request.holders and pick_replica(rid, spec.replicas) == handle.replica]
        for rid in victims:
            self._finish(rid, StageFailed(f"stage {handle.name} died ({reason}) while serving request {rid}"))
        unlink_shm_prefix(shm_owner(self.instance, handle.stage, handle.replica))
        if handle.process is not None:
            cleanup_dead_process(self._channels_in_use(), handle.pid)
        remove_socket(self.run_dir, handle.name)
        self.outbox.reset(handle.name)  # drop what was queued for the dead process
        delay = restart_delay(handle, spec.restart_window_s)
        if len(handle.restarts) >= spec.max_restarts:  # a rate, as in OTP: rest, then try again afresh
            handle.state = ActorState.DOWN
            log.error("stage %s is down: %d restarts within %g s; retrying in %g s", handle.name,
                      len(handle.restarts), spec.restart_window_s, spec.restart_cooldown_s)
            self._tasks.append(asyncio.create_task(self._restart(handle, spec.restart_cooldown_s, victims, True)))
            return
        self._tasks.append(asyncio.create_task(self._restart(handle, delay, victims)))

    async def _restart(self, handle: ActorHandle, delay: float, victims: list[str], afresh: bool = False) -> None:
        await asyncio.sleep(delay)
        if self._closed:
            return
        if afresh:
            handle.restarts.clear()
        handle.restarts.append(time.monotonic())
        self.restarts_total[handle.stage] += 1
        self._launcher.launch(handle)
        try:
            await self._await_ready(handle)
        except StageStartError as exc:
            log.error("restart failed: %s", exc)
            await self._on_death(handle, str(exc))
            return
        for name in self._handles:
            if name != handle.name:
                self._send(name, m.PeerUpdate(handle.stage, handle.replica, endpoint(self.run_dir, handle.name)))
        for rid in victims:
            self._send(handle.name, m.RequestCancel(rid, "stage restarted"))
        log.warning("stage %s restarted", handle.name)

    # ---- queries ----------------------------------------------------------------------------

    def health(self) -> dict[str, str]:
        """Per stage: "up" only when every replica is up, else the worst replica state."""
        order = [ActorState.DOWN, ActorState.RESTARTING, ActorState.STARTING, ActorState.STOPPED, ActorState.UP]
        out: dict[str, str] = {}
        for spec in self.graph.stages:
            states = [self._handles[actor_name(spec.name, r)].state for r in range(spec.replicas)]
            out[spec.name] = min(states, key=order.index).value
        return out

    def capabilities(self) -> dict[str, list[str]]:
        """Capability -> the stages that serve only it (a request that does not need it skips them)."""
        return self.router.capabilities()

    def degraded(self) -> list[str]:
        """Capabilities not served now (a stage of theirs is not up); the core is never among them."""
        states = self.health()
        return sorted(cap for cap, stages in self.capabilities().items() if any(states[s] != "up" for s in stages))

    async def _query(self, timeout_s: float) -> dict[str, dict[str, Any] | None]:
        token = next(self._query_ids)
        replies: dict[str, Any] = {}
        self._queries[token] = replies
        up = [h.name for h in self._handles.values() if h.state is ActorState.UP]
        try:
            for name in up:
                self._send(name, m.StatsQuery(token))
            deadline = time.monotonic() + timeout_s
            while len(replies) < len(up) and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
        finally:
            self._queries.pop(token, None)
        return {name: replies.get(name) for name in self._handles}

    async def probe(self, timeout_s: float = 1.0) -> dict[str, bool]:
        """Does every stage's mailbox answer now? Keyed by stage name (all replicas must)."""
        replies = await self._query(timeout_s)
        out: dict[str, bool] = {}
        for name, stats in replies.items():
            stage = name.rsplit(".", 1)[0]
            out[stage] = out.get(stage, True) and stats is not None
        return out

    async def stats(self, timeout_s: float = 1.0) -> dict[str, dict[str, Any]]:
        replies = await self._query(timeout_s)
        out: dict[str, dict[str, Any]] = {}
        for name, stats in replies.items():
            handle = self._handles[name]
            out[name] = {**(stats or handle.last_stats), "state": handle.state.value,
                         "restarts": len(handle.restarts), "pid": handle.pid}
        out["kernel"] = {"in_flight": len(self._inflight), "max_inflight": self.max_inflight,
                         "restarts_total": dict(self.restarts_total), "degraded_capabilities": len(self.degraded())}
        return out

    def _channels_in_use(self) -> set[str]:
        return {edge_channel(self.graph, e) for e in self.graph.edges}

    def holders(self, rid: str) -> set[str]:
        """The stages an in-flight request still holds state in or has to pass through (empty once it ended)."""
        request = self._inflight.get(rid)
        return set(request.holders) if request is not None else set()

    def kill(self, stage: str, replica: int = 0) -> None:
        """Kill one replica as a crash would (SIGKILL, or cancelling its task inline): fault drills."""
        self._launcher.kill(self._handles[actor_name(stage, replica)])

    def pid_of(self, stage: str, replica: int = 0) -> int:
        return self._handles[actor_name(stage, replica)].pid

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    # ---- plumbing --------------------------------------------------------------------------

    def _send(self, name: str, msg: m.Msg) -> bool:
        return self.outbox.send(name, msg)
