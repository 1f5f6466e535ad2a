"""The stage actor: a mailbox loop around one pure `Stage`.

The loop thread only does IO: it reads the inbound socket, decodes messages, tracks credits and
sends outputs. Everything the stage does runs in one compute thread (`StageDriver`), so the mailbox
answers stats queries, credits and cancels while a long step runs, and a stage needs no locks. The
same class runs in a stage process (`omni.cluster.proc`) and as an asyncio task in the kernel's
process (library mode).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from omni.kernel import messages as m
from omni.kernel.bus import Mailbox, Outbox
from omni.kernel.driver import Chunk, End, Open, StageDriver
from omni.kernel.errors import PayloadTooLarge
from omni.kernel.graph import OUT, EdgeSpec, Graph
from omni.kernel.routing import inputs_expected, replica_of
from omni.cluster.addresses import across, bind_to, endpoint, learn, node
from omni.kernel.rundir import KERNEL, actor_name, shm_owner
from omni.kernel.stage import Emit
from omni.lane_clock import LaneClock
from omni.transport.channels import ChannelFull, Readers, Writers, channel_of
from omni.transport.arrays import is_array, rows_of, split_rows

log = logging.getLogger("omni.actor")

HEARTBEAT_S = 0.5


@dataclass
class _Link:
    """Producer-side state of one (edge, consumer replica): credits, its channel (by where the consumer
    was placed) and the slots not yet returned."""

    credits: int
    channel: str
    outstanding: list[int] = field(default_factory=list)


class Actor:
    def __init__(self, graph: Graph, stage: str, replica: int, run_dir: str, instance: str) -> None:
        self.graph, self.spec, self.replica = graph, graph.stage(stage), replica
        self.name = actor_name(stage, replica)
        self.run_dir, self.endpoint = run_dir, bind_to(run_dir, self.name)
        self.outbox = Outbox(lambda peer: endpoint(run_dir, peer), self.name)
        self.driver = StageDriver(graph, stage, replica)
        self.out_edges = graph.outgoing(stage)
        self.readers = Readers(self.spec.device_of(replica))
        self.writers = Writers(graph, shm_owner(instance, stage, replica), self.spec.arena_bytes)
        self._links: dict[tuple[int, str], _Link] = {}  # (edge id, consumer replica) -> its link
        self._credit_event = asyncio.Event()
        self._wake = asyncio.Event()
        self._opened: dict[str, m.RequestOpen] = {}  # rid -> its Open (skip list, replicas), while open here
        self._final_buffers: dict[tuple[str, int], list[dict[str, Any]]] = {}  # (rid, edge id) -> data
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"compute-{self.name}")
        self._held: list[tuple[Any, list[Chunk]]] = []  # (mark, credits) until the GPU has read those rows
        self._stopping = asyncio.Event()
        self._main_task: asyncio.Task | None = None
        self.lanes = LaneClock("setup", ("emit", "idle", "compute", "credit_wait"))  # where the loop's time goes

    # ---- lifecycle ----------------------------------------------------------------------

    async def run(self) -> None:
        """Bind, set the stage up, report ready, then serve until shutdown."""
        self.mailbox = Mailbox(self.endpoint, self.lanes.timed("recv", self._dispatch), self.name)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._pool, self.driver.setup)
        except Exception as exc:
            log.exception("stage %s failed to set up", self.name)
            self.outbox.send(KERNEL, m.ActorFailed(self.spec.name, self.replica, f"{type(exc).__name__}: {exc}"))
            await asyncio.sleep(0.1)
            return self.close()
        self.lanes.enter("emit")  # the loop's own work: sending outputs and credits
        self.mailbox.start()
        self.outbox.send(KERNEL, m.ActorReady(self.spec.name, self.replica, os.getpid(), self.mailbox.address, node()))
        heartbeat = asyncio.create_task(self._heartbeat_loop())
        self._main_task = asyncio.create_task(self._main_loop())
        try:
            await self._main_task
        except asyncio.CancelledError:
            pass  # stop() cancels a loop that may be blocked sending to a peer that is gone
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
            await loop.run_in_executor(self._pool, self.driver.teardown)
            self.close()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._main_task is not None:
            self._main_task.cancel()

    def close(self) -> None:
        self.writers.close()
        self.readers.close()
        self.outbox.close()
        self.mailbox.close()
        self._pool.shutdown(wait=False)

    # ---- inbound --------------------------------------------------------------------------

    def _dispatch(self, msg: m.AnyMsg, frames: list[Any]) -> None:
        match msg:
            case m.RequestOpen():
                if self.driver.is_dead(msg.rid) or msg.rid in self._opened:
                    return
                self._opened[msg.rid] = msg
                params = {**msg.params, "sampling": msg.sampling}  # the stage reads its own by name
                self.driver.post(Open(msg.rid, params, inputs_expected(self.graph, self.spec.name, msg.skip)))
                for dst in {e.dst for e in self._edges_of(msg.rid).values()} - {OUT}:
                    self.outbox.send(replica_of(dst, msg.replicas), self._open_for(dst, msg))
            case m.RequestChunk():
                data, tokens = self.readers.read(msg, frames)
                edge = self.graph.edges[msg.edge]
                producer = actor_name(edge.src, msg.src)
                for rid, part, last in split_rows(msg.rid, msg.rows, data):  # the slots' credit with the last
                    self.driver.post(Chunk(rid, edge.dst_port, part, msg.edge, producer if last else "",
                                           tokens if last else []))
            case m.RequestEnd():
                self.driver.post(End(msg.rid, msg.edge))
            case m.RequestCancel():
                self.driver.post_cancel(msg.rid)
                self._forget(msg.rid)
            case m.EdgeCredit():
                self._on_credit(msg)
            case m.StatsQuery():
                self.outbox.send(KERNEL, m.StatsReply(msg.token, self.spec.name, self.replica, self.stats()))
            case m.PeerUpdate():
                learn(self.run_dir, actor_name(msg.stage, msg.replica), msg.address, msg.node)
                self._reset_peer(actor_name(msg.stage, msg.replica))
            case m.ActorShutdown():
                self.stop()
            case _:
                self.mailbox.dropped += 1
                log.warning("%s dropped an unexpected %s", self.name, type(msg).__name__)
        self._wake.set()

    def _open_for(self, dst: str, msg: m.RequestOpen) -> m.RequestOpen:
        """The Open `dst` gets: without the request's media unless it takes them."""
        if self.graph.takes_media(dst) or not (media := set(self.graph.media) & msg.params.keys()):
            return msg
        return m.RequestOpen(msg.rid, {k: v for k, v in msg.params.items() if k not in media}, msg.skip, msg.sampling,
                             msg.replicas)

    # ---- credits and payload slots ----------------------------------------------------------

    def _link(self, edge_id: int, peer: str) -> _Link:
        if (edge_id, peer) not in self._links:
            edge = self.graph.edges[edge_id]
            credits = 1 << 30 if edge.dst == OUT else self.graph.stage(edge.dst).credits
            self._links[edge_id, peer] = _Link(credits, across(self.run_dir, peer, channel_of(self.graph, edge)))
        return self._links[edge_id, peer]

    def _on_credit(self, msg: m.EdgeCredit) -> None:
        if (link := self._links.get((msg.edge, msg.consumer))) is None:
            return
        for token in msg.tokens:
            if token in link.outstanding:
                link.outstanding.remove(token)
                self.writers.free(link.channel, token)
        link.credits += 1
        self._credit_event.set()

    def _reset_peer(self, peer: str) -> None:
        """A downstream replica restarted: forget what it held and talk to the new process."""
        self.outbox.reset(peer)
        for edge_id, link_peer in [key for key in self._links if key[1] == peer]:
            for token in (link := self._links.pop((edge_id, link_peer))).outstanding:
                self.writers.free(link.channel, token)
        self._credit_event.set()

    def _free_slots(self, payloads: list[m.PayloadDesc]) -> None:
        for desc in payloads:
            if (token := self.readers.token(desc)) is not None:
                self.writers.get(desc.channel).free(token)

    async def _credit(self) -> None:
        self._credit_event.clear()
        await self.lanes.wait("credit_wait", self._credit_event.wait())

    # ---- outbound ---------------------------------------------------------------------------

    def _peer(self, edge: EdgeSpec, rid: str) -> str:
        opened = self._opened.get(rid)  # None: it ended here while its last sends waited (a dropped send)
        return KERNEL if edge.dst == OUT else replica_of(edge.dst, opened.replicas if opened else {})

    async def _send_chunk(self, edge_id: int, rids: list[str], data: dict[str, Any]) -> None:
        """One message: a chunk of rids[0], or (more rids) the batch whose row i is rids[i]'s."""
        edge = self.graph.edges[edge_id]
        peer = self._peer(edge, rids[0])
        while (link := self._link(edge_id, peer)).credits <= 0:
            await self._credit()
        meta: dict[str, Any] = {}
        payloads: list[m.PayloadDesc] = []
        frames: list[Any] = []
        try:
            for key, value in data.items():
                if not is_array(value):
                    meta[key] = value
                    continue
                desc, extra = await self._write_array(edge, link.channel, key, value)
                if extra:  # inline, network: the bytes ride beside the message
                    desc.frame = len(frames)
                    frames.extend(extra)
                payloads.append(desc)
        except BaseException:  # e.g. one array too large for the arena: the chunk's other slots come back
            self._free_slots(payloads)
            raise
        batch = rids if len(rids) > 1 else []
        if not self.outbox.send(peer, m.RequestChunk(rids[0], edge_id, meta, payloads, batch, self.replica), frames):
            return self._free_slots(payloads)  # the consumer is gone; the supervisor fails the request
        link.credits -= 1
        link.outstanding.extend(t for t in map(self.readers.token, payloads) if t is not None)

    async def _write_array(self, edge: EdgeSpec, channel: str, key: str, value: Any) -> tuple[m.PayloadDesc, list[Any]]:
        while True:
            try:
                return self.writers.write(edge, channel, key, value)
            except PayloadTooLarge as exc:
                raise PayloadTooLarge(f"stage {self.spec.name} cannot send {key!r} ({getattr(value, 'nbytes', 0)} "
                                      f"bytes) on {edge}: {exc}") from None
            except ChannelFull:
                if not any(link.outstanding for link in self._links.values()):
                    raise
                await self._credit()

    async def _emit(self, emit: Emit) -> None:
        """Send one output or batch; whatever goes wrong while sending fails its requests, never the actor."""
        rid, rows = emit.rid, emit.rows or [emit.rid]
        try:
            if emit.data is not None:
                await self._send_rows(emit.port, rows, emit.data)
            if emit.rows is not None or rid not in self._opened:  # a batch; or cancelled, or finished here
                return
            if emit.error is not None:
                return self._fail(rid, emit.error_kind, emit.error)
            if emit.finish:
                for edge_id, edge in self._edges_of(rid).items():
                    for data in self._final_buffers.pop((rid, edge_id), []):
                        await self._send_chunk(edge_id, [rid], data)
                    self.outbox.send(self._peer(edge, rid), m.RequestEnd(rid, edge_id, emit.end_meta or {}))
                self._forget(rid)
                self.outbox.send(KERNEL, m.RequestLeft(rid, self.spec.name))
        except Exception as exc:
            for rid in (r for r in rows if r in self._opened):
                log.warning("%s could not send the output of %s: %s: %s", self.name, rid, type(exc).__name__, exc)
                self._fail(rid, getattr(exc, "kind", "stage_failed"), f"{type(exc).__name__}: {exc}")

    async def _send_rows(self, port: str, rows: list[str], data: dict[str, Any]) -> None:
        """Chunks of `rows` (row i of each array is rows[i]'s) on `port`, as one message per edge and
        consumer replica (per request to the client and on final edges); rows of requests not open
        here, or that skip the edge's stage, are dropped."""
        for edge_id, edge in ((i, e) for i, e in self.out_edges.items() if e.port == port):
            groups: dict[str, list[int]] = {}
            for i, rid in enumerate(rows):
                if rid in self._opened and edge_id in self._edges_of(rid):
                    alone = edge.dst == OUT or edge.mode == "final"
                    groups.setdefault(rid if alone else self._peer(edge, rid), []).append(i)
            for idx in groups.values():
                rids, part = [rows[i] for i in idx], data if len(idx) == len(rows) else rows_of(data, idx)
                if edge.mode == "final":
                    self._final_buffers.setdefault((rids[0], edge_id), []).append(part)
                else:
                    await self._send_chunk(edge_id, rids, part)

    def _fail(self, rid: str, kind: str, message: str) -> None:
        self.outbox.send(KERNEL, m.RequestError(rid, self.spec.name, kind, message))
        self.driver.post_cancel(rid)
        self._forget(rid)

    def _edges_of(self, rid: str) -> dict[int, EdgeSpec]:
        """The outgoing edges this request uses (none into a stage it skips)."""
        skip = self._opened[rid].skip if rid in self._opened else None
        return {i: e for i, e in self.out_edges.items() if e.dst not in skip} if skip else self.out_edges

    def _forget(self, rid: str) -> None:
        self._opened.pop(rid, None)
        for key in [k for k in self._final_buffers if k[0] == rid]:
            del self._final_buffers[key]

    # ---- the loop ----------------------------------------------------------------------------

    async def _main_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            if not self.driver.wants_step():
                if self._held:  # nothing to do: wait for the GPU reads of the credits held back
                    marks = [mk for mk, _ in self._held if mk is not None]
                    await self.lanes.wait("compute", loop.run_in_executor(self._pool, lambda: [mk.wait() for mk in marks]))
                    self._send_credits()
                self._wake.clear()
                if not self.driver.wants_step():
                    await self.lanes.wait("idle", self._wake.wait())
                    continue
            emits, taken, mark = await self.lanes.wait("compute", loop.run_in_executor(self._pool, self._step))
            credits = [c for c in taken if c.producer]  # the rows of a batch but its last owe none
            if credits:
                self._held.append((mark, credits))
            self._send_credits()
            for emit in emits:
                await self._emit(emit)

    def _step(self) -> tuple[list[Emit], list[Chunk], Any]:
        """One round of the driver, in the compute thread, and the mark its GPU reads of the chunks it
        took must pass before their slots go back (None: no GPU reads)."""
        emits, taken = self.driver.run_once()
        return emits, taken, self.readers.mark() if taken and self.readers.mark is not None else None

    def _send_credits(self) -> None:
        """The held credits whose GPU reads are done, oldest first (the host never waits for them)."""
        while self._held and (self._held[0][0] is None or self._held[0][0].done()):
            for chunk in self._held.pop(0)[1]:
                self.outbox.send(chunk.producer, m.EdgeCredit(chunk.edge, self.name, chunk.tokens))

    async def _heartbeat_loop(self) -> None:
        while True:
            self.outbox.send(KERNEL, m.ActorHeartbeat(self.spec.name, self.replica, self.stats()))
            await asyncio.sleep(HEARTBEAT_S)

    def stats(self) -> dict[str, Any]:
        """`time_s`: the loop's lanes (they add up to the wall time), the compute thread's `step` seconds and
        the stage's own parts (e.g. "gpu")."""
        return {**self.lanes.merged(self.driver.stats()), "dropped_messages": self.mailbox.dropped, "time": time.time()}
