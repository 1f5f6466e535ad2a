"""The microkernel: starts the graph's actors, admits requests, routes their entry and exit.

The kernel is not on the data path between stages (actors push to each other directly); it
sends each request's Open to the entry stage, receives what flows into `$out`, and broadcasts
cancels. Its supervisor (`supervisor.py`) starts, watches and restarts the actors; when one
dies, the kernel fails the requests it held.

    kernel = Kernel(graph, mode="process")      # or "inline": same actors as asyncio tasks
    kernel = Kernel(graph, host=RayHost("ray://head:10001"))  # stages on a Ray cluster (omni/cluster)
    await kernel.start()
    async for event in kernel.submit({"prompt": "hi"}):
        ...
    await kernel.stop()
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import shutil
import time
import uuid
from dataclasses import asdict
from typing import Any

from omni.kernel import messages as m
from omni.kernel.bus import Mailbox, Outbox
from omni.kernel.errors import (DeadlineExceeded, GraphError, KernelClosed, OmniError, Overloaded, RequestCancelled,
                                StageFailed, StageStartError, error_from_kind)
from omni.kernel.graph import Graph
from omni.kernel.requests import InflightRequest, OutputEvent, RequestStream
from omni.kernel.routing import Router, replica_of
from omni.cluster.addresses import bind_to, endpoint
from omni.cluster.balancer import Balancer
from omni.kernel.rundir import KERNEL, actor_name, make_run_dir, new_instance_id, shm_owner
from omni.kernel.supervisor import ActorHandle, ActorState, Supervisor
from omni.sampling import split_sampling
from omni.transport.channels import Readers, release_leftovers

log = logging.getLogger("omni.kernel")

ENTRY_EDGE = -1  # the client's edge into the entry stage


class Kernel:
    def __init__(self, graph: Graph, mode: str = "process", max_inflight: int = 64, heartbeat_timeout_s: float = 30.0,
                 log_level: str = "WARNING", env: dict[str, str] | None = None, host: Any = None) -> None:
        graph.validate()
        self.graph, self.max_inflight, self.instance, self.run_dir = graph, max_inflight, new_instance_id(), ""
        self.supervisor = Supervisor(graph, mode, self.instance, self._on_replica_death, heartbeat_timeout_s,
                                     log_level, env or {}, host)
        self._inflight: dict[str, InflightRequest] = {}
        self.balancer = Balancer(graph, lambda name: self.supervisor.handles[name].state is ActorState.UP)
        self._readers = Readers()
        self._queries: dict[int, dict[str, Any]] = {}
        self._query_ids = itertools.count()
        self._started = self._closed = False
        try:
            self.router = Router(graph)
        except (ImportError, AttributeError, ValueError) as exc:
            raise GraphError(f"graph {graph.name!r}: cannot load its needs {graph.needs!r}: {exc}") from None

    async def start(self) -> None:
        self.run_dir = str(make_run_dir(self.instance))
        self.mailbox = Mailbox(bind_to(self.run_dir, KERNEL, self.supervisor.host.bus_host), self._dispatch, KERNEL)
        self.supervisor.env = {**self.supervisor.env, "OMNI_KERNEL_BUS": self.mailbox.address}  # actors report here
        self.outbox = Outbox(lambda peer: endpoint(self.run_dir, peer), KERNEL)
        self.mailbox.start()
        try:
            await self.supervisor.start(self.run_dir, self.outbox)
            await self._query(5.0)  # every mailbox answered, so each has what the kernel told it first
        except StageStartError:
            await self.stop()
            raise
        self._started = True

    async def stop(self) -> None:
        """Stop every actor; leaves no process, socket file or shm segment behind."""
        if self._closed:
            return
        self._closed = True
        self.end_requests("the kernel is shutting down")
        await self.supervisor.stop()
        self.outbox.close()
        self.mailbox.close()
        self._readers.close()
        release_leftovers(self.graph, shm_owner(self.instance))
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def end_requests(self, reason: str) -> None:
        """End every in-flight request with KernelClosed(reason), freed in every stage; the stages
        stay up (a server ending its streams before it stops them)."""
        for rid in list(self._inflight):
            self._finish(rid, KernelClosed(reason))

    async def __aenter__(self) -> Kernel:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    def submit(self, params: dict[str, Any], rid: str | None = None, deadline_s: float | None = None) -> RequestStream:
        """Admit a request; raises Overloaded when `max_inflight` requests are running."""
        if self._closed or not self._started:
            raise KernelClosed("the kernel is not running")
        if len(self._inflight) >= self.max_inflight:
            raise Overloaded(f"{len(self._inflight)} requests in flight (limit {self.max_inflight}); retry later")
        rid = rid or uuid.uuid4().hex
        if rid in self._inflight:
            raise ValueError(f"request id {rid!r} is already in flight")
        params, sampling = split_sampling(params)
        try:
            route = self.router.route(params)
        except Exception as exc:  # a family's `needs` that cannot read these params: use every stage
            log.warning("routing failed (%s: %s); the request uses every stage", type(exc).__name__, exc)
            route = Router.everything(self.graph)
        placed = self.balancer.place(rid, route.stages, params)  # StageDown if one it uses has no replica up
        request = self._inflight[rid] = InflightRequest(rid, route.exits, set(route.stages))
        if deadline_s is not None:
            request.deadline_handle = asyncio.get_running_loop().call_later(deadline_s, self._expire, rid, deadline_s)
        entry = replica_of(self.graph.entry, placed)
        if not (self._send(entry, m.RequestOpen(rid, params, route.skip, sampling, placed))
                and self._send(entry, m.RequestEnd(rid, ENTRY_EDGE))):
            self._finish(rid, StageFailed(f"stage {entry} is not reachable"))
        return RequestStream(request, self.cancel)

    async def cancel(self, rid: str, reason: str = "cancelled by the client") -> None:
        if rid in self._inflight:
            self._finish(rid, RequestCancelled(reason))

    def _expire(self, rid: str, deadline_s: float) -> None:
        if rid in self._inflight:
            self._finish(rid, DeadlineExceeded(f"request {rid} passed its {deadline_s:g} s deadline"))

    def _finish(self, rid: str, error: OmniError | None = None) -> None:
        """End a request for the client; on error, tell every stage to free its state."""
        if (request := self._inflight.pop(rid, None)) is None:
            return
        request.end(error)
        self.balancer.done(rid)
        if error is not None:
            for handle in self.supervisor.handles.values():
                if handle.state not in (ActorState.DOWN, ActorState.STOPPED):
                    self._send(handle.name, m.RequestCancel(rid))

    def _on_replica_death(self, handle: ActorHandle, reason: str) -> list[str]:
        """A replica died: fail the requests that hold state in its stage or still have to pass
        through it, on that replica; returns their ids."""
        victims = [rid for rid, request in self._inflight.items()
                   if handle.stage in request.holders and self.balancer.replica(rid, handle.stage) == handle.name]
        for rid in victims:
            self._finish(rid, StageFailed(f"stage {handle.name} died ({reason}) while serving request {rid}"))
        return victims

    def _dispatch(self, msg: m.AnyMsg, frames: list[Any]) -> None:
        match msg:
            case m.RequestChunk():
                self._on_output(msg, frames)
            case m.RequestEnd():
                if (request := self._inflight.get(msg.rid)) is not None:
                    request.final_meta.update(msg.meta)
                    request.pending_exits.discard(msg.edge)
                    if not request.pending_exits:
                        self._finish(msg.rid)
            case m.RequestLeft():
                if (request := self._inflight.get(msg.rid)) is not None:
                    request.holders.discard(msg.stage)
                    self.balancer.left(msg.rid, msg.stage)
            case m.RequestError():
                self._finish(msg.rid, error_from_kind(msg.kind, f"stage {msg.stage}: {msg.message}"))
            case m.ActorReady() | m.ActorFailed() | m.ActorHeartbeat():
                self.supervisor.on_report(msg)
            case m.StatsReply():
                if msg.token in self._queries:
                    self._queries[msg.token][actor_name(msg.stage, msg.replica)] = msg.stats
            case _:
                log.warning("kernel dropped an unexpected %s", type(msg).__name__)

    def _on_output(self, msg: m.RequestChunk, frames: list[Any]) -> None:
        data, tokens = self._readers.read(msg, frames)
        for desc in msg.payloads:  # copied: a view is valid only until its slot is credited back
            view = data[desc.name]
            data[desc.name] = view.clone() if hasattr(view, "clone") else view.copy()
        edge = self.graph.edges[msg.edge]
        if tokens:  # exit edges have no credit limit; only payload slots need returning
            self._send(actor_name(edge.src, msg.src), m.EdgeCredit(msg.edge, KERNEL, tokens))
        if (request := self._inflight.get(msg.rid)) is not None:
            request.queue.put_nowait(OutputEvent(msg.rid, edge.src, edge.port, data))

    def health(self) -> dict[str, str]:
        """Per stage: "up" only when every replica is up, else the worst replica state."""
        return self.supervisor.health()

    def capabilities(self) -> dict[str, list[str]]:
        """Capability -> the stages that serve only it (a request that does not need it skips them)."""
        return self.router.capabilities()

    def degraded(self) -> list[str]:
        """Capabilities not served now (a stage of theirs is not up); the core is never among them."""
        states = self.health()
        return sorted(cap for cap, stages in self.capabilities().items() if any(states[s] != "up" for s in stages))

    async def _query(self, timeout_s: float) -> dict[str, dict[str, Any] | None]:
        """Every replica's stats, asked now; None for one that did not answer within `timeout_s`."""
        token = next(self._query_ids)
        replies: dict[str, Any] = {}
        self._queries[token] = replies
        up = [h.name for h in self.supervisor.handles.values() if h.state is ActorState.UP]
        try:
            for name in up:
                self._send(name, m.StatsQuery(token))
            deadline = time.monotonic() + timeout_s
            while len(replies) < len(up) and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
        finally:
            self._queries.pop(token, None)
        return {name: replies.get(name) for name in self.supervisor.handles}

    async def probe(self, timeout_s: float = 1.0) -> dict[str, bool]:
        """Does every stage's mailbox answer now? Keyed by stage name (all replicas must)."""
        out: dict[str, bool] = {}
        for name, stats in (await self._query(timeout_s)).items():
            stage = self.supervisor.handles[name].stage
            out[stage] = out.get(stage, True) and stats is not None
        return out

    async def stats(self, timeout_s: float = 1.0) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for name, stats in (await self._query(timeout_s)).items():
            handle = self.supervisor.handles[name]
            out[name] = {**(stats or handle.last_stats), "state": handle.state.value,
                         "up": int(handle.state is ActorState.UP), "down": int(handle.state is ActorState.DOWN),
                         "restarts_in_window": len(handle.restarts), **asdict(handle.counts), "pid": handle.live_pid}
        out["kernel"] = {"in_flight": len(self._inflight), "max_inflight": self.max_inflight,
                         "restarts_total": dict(self.restarts_total), "degraded_capabilities": len(self.degraded())}
        return out

    @property
    def restarts_total(self) -> dict[str, int]:
        return self.supervisor.restarts_total

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def holders(self, rid: str) -> set[str]:
        """The stages an in-flight request still holds state in or has to pass through (empty once it ended)."""
        return set(self._inflight[rid].holders) if rid in self._inflight else set()

    def kill(self, stage: str, replica: int = 0) -> None:
        """Kill one replica as a crash would (SIGKILL, or cancelling its task inline): fault drills."""
        self.supervisor.handles[actor_name(stage, replica)].kill()

    def pid_of(self, stage: str, replica: int = 0) -> int:
        return self.supervisor.handles[actor_name(stage, replica)].pid

    def _send(self, name: str, msg: m.Msg) -> bool:
        return self.outbox.send(name, msg)

