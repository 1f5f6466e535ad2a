"""The stage actor: a mailbox loop around one pure `Stage`.

The loop thread only does IO: it reads the inbound socket, decodes messages, tracks credits
and sends outputs. Everything the stage does runs in one compute thread (`StageDriver`), so
the mailbox answers stats queries, credits and cancels while a long step runs, and a stage
needs no locks. The same class runs in a stage process (`omni.kernel.proc`) and as an
asyncio task inside the kernel's process (library mode).
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec

from omni.kernel import messages as m
from omni.kernel.bus import Mailbox, Outbox
from omni.kernel.channels import ChannelFull, is_array, load_channel
from omni.kernel.driver import StageDriver
from omni.kernel.errors import PayloadTooLarge
from omni.kernel.graph import OUT, EdgeSpec, Graph
from omni.kernel.routing import inputs_expected
from omni.kernel.rundir import actor_name, endpoint, shm_owner
from omni.kernel.stage import Emit

log = logging.getLogger("omni.actor")

KERNEL = "kernel"
INLINE_MAX_BYTES = 16 << 10  # smaller arrays ride as zmq frames whatever the edge's channel
HEARTBEAT_S = 0.5


def pick_replica(rid: str, replicas: int) -> int:
    """A request keeps one replica per stage: stable, no coordination needed."""
    return zlib.crc32(rid.encode()) % replicas if replicas > 1 else 0


def edge_channel(graph: Graph, edge: EdgeSpec) -> str:
    """The channel an edge uses: forced by the graph, else chosen from placement."""
    if edge.channel != "auto":
        return edge.channel
    if edge.dst == OUT:
        return "inline"
    src, dst = graph.stage(edge.src), graph.stage(edge.dst)
    if all(d.startswith("cuda") for d in src.all_devices() + dst.all_devices()):
        return "cuda_ipc"
    return "shm"


@dataclass
class _PeerLink:
    """Producer-side state of one (edge, consumer replica): credits and slots not yet returned."""

    credits: int
    outstanding: list[int] = field(default_factory=list)


class Actor:
    def __init__(self, graph: Graph, stage: str, replica: int, run_dir: str, instance: str) -> None:
        self.graph = graph
        self.spec = graph.stage(stage)
        self.replica = replica
        self.run_dir = run_dir
        self.instance = instance
        self.name = actor_name(stage, replica)
        self.endpoint = endpoint(run_dir, self.name)
        self.out_edges = graph.outgoing(stage)
        self.in_edges = graph.incoming(stage)
        self.driver = StageDriver(graph, self.spec, replica, run_dir, n_inputs=max(1, len(self.in_edges)))
        self.outbox = Outbox(lambda peer: endpoint(run_dir, peer), self.name)
        self._links: dict[tuple[str, str], _PeerLink] = {}
        self._credit_event = asyncio.Event()
        self._wake = asyncio.Event()
        self._writers: dict[str, Any] = {}
        self._readers: dict[str, Any] = {}
        self._opened: dict[str, dict[str, Any]] = {}  # rid -> params, for requests seen here
        self._skips: dict[str, set[str]] = {}  # rid -> stages it skips (routing.py), when any
        self._final_buffers: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"compute-{self.name}")
        self._stopping = asyncio.Event()
        self.dropped = 0  # malformed or unknown messages

    # ---- lifecycle ----------------------------------------------------------------------

    async def run(self, ready_extra: dict[str, Any] | None = None) -> None:
        """Bind, set the stage up, report ready, then serve until shutdown."""
        self.mailbox = Mailbox(self.endpoint, self._on_frames, self.name)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._pool, self.driver.setup)
        except Exception as exc:
            log.exception("stage %s failed to set up", self.name)
            self._send(KERNEL, m.ActorFailed(self.spec.name, self.replica, _pid(), f"{type(exc).__name__}: {exc}"))
            await asyncio.sleep(0.1)
            self.close()
            return
        self.mailbox.start()
        self._send(KERNEL, m.ActorReady(self.spec.name, self.replica, _pid(), self.endpoint, ready_extra or {}))
        tasks = [asyncio.create_task(self._heartbeat_loop())]
        self._main_task = asyncio.create_task(self._main_loop())
        try:
            await self._main_task
        except asyncio.CancelledError:
            pass  # stop() cancels a loop that may be blocked sending to a peer that is gone
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await loop.run_in_executor(self._pool, self.driver.teardown)
            self.close()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        task = getattr(self, "_main_task", None)
        if task is not None:
            task.cancel()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        for reader in self._readers.values():
            reader.close()
        self.outbox.close()
        self.mailbox.close()
        self._pool.shutdown(wait=False)

    # ---- inbound --------------------------------------------------------------------------

    def _on_frames(self, frames: list[Any]) -> None:
        try:
            msg = m.decode(frames[0].buffer)
            self._dispatch(msg, frames[1:])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.dropped += 1
            log.warning("%s dropped a malformed message: %s", self.name, exc)
        except Exception:
            self.dropped += 1
            log.exception("%s failed to handle a message; dropped", self.name)

    def _dispatch(self, msg: m.AnyMsg, frames: list[Any]) -> None:
        match msg:
            case m.RequestOpen():
                if self.driver.is_dead(msg.rid) or msg.rid in self._opened:
                    return
                self._opened[msg.rid] = msg.params
                if msg.skip:
                    self._skips[msg.rid] = set(msg.skip)
                inputs = inputs_expected(self.graph, self.spec.name, msg.skip) if msg.skip else None
                self.driver.post_open(msg.rid, msg.params, inputs)
                for edge in self._edges_of(msg.rid):
                    if edge.dst != OUT:
                        self._send_to_edge(edge, msg.rid, m.RequestOpen(msg.rid, msg.params, msg.deadline, edge.id,
                                                                        msg.skip))
            case m.RequestChunk():
                data = self._read_payloads(msg, frames)
                credit = (msg.edge, self._producer_of(msg.edge, msg.rid), [self._reader_token(d) for d in msg.payloads])
                self.driver.post_chunk(msg.rid, self._dst_port(msg.edge), data, credit)
            case m.RequestEnd():
                self.driver.post_end(msg.rid, msg.edge)
            case m.RequestCancel():
                self.driver.post_cancel(msg.rid)
                self._forget(msg.rid)
            case m.EdgeCredit():
                self._on_credit(msg)
            case m.StatsQuery():
                self._send(KERNEL, m.StatsReply(msg.token, self.spec.name, self.replica, self.stats()))
            case m.PeerUpdate():
                self._reset_peer(msg.stage, msg.replica)
            case m.ActorShutdown():
                self.stop()
            case _:
                self.dropped += 1
                log.warning("%s dropped an unexpected %s", self.name, type(msg).__name__)
        self._wake.set()

    def _read_payloads(self, msg: m.RequestChunk, frames: list[Any]) -> dict[str, Any]:
        data = dict(msg.meta)
        for desc in msg.payloads:
            data[desc.name] = self._reader(desc.channel).read(desc, frames)
        return data

    def _reader(self, channel: str) -> Any:
        if channel not in self._readers:
            reader = self._readers[channel] = load_channel(channel).reader()
            if hasattr(reader, "device"):  # cuda_ipc: tensors of another GPU's pool are copied here
                reader.device = self.spec.device_of(self.replica)
            if hasattr(reader, "fence"):
                self.driver.fence = reader.fence
        return self._readers[channel]

    def _reader_token(self, desc: m.PayloadDesc) -> int:
        token = self._reader(desc.channel).token(desc)
        return -1 if token is None else token

    def _producer_of(self, edge_id: str, rid: str) -> str:
        src = edge_id.split(".", 1)[0]
        if src == "$in":
            return KERNEL
        return actor_name(src, pick_replica(rid, self.graph.stage(src).replicas))

    def _dst_port(self, edge_id: str) -> str:
        return edge_id.rsplit(".", 1)[-1]

    # ---- credits ----------------------------------------------------------------------------

    def _link(self, edge: EdgeSpec, peer: str) -> _PeerLink:
        key = (edge.id, peer)
        if key not in self._links:
            credits = 1 << 30 if edge.dst == OUT else self.graph.stage(edge.dst).credits
            self._links[key] = _PeerLink(credits)
        return self._links[key]

    def _on_credit(self, msg: m.EdgeCredit) -> None:
        edge = next((e for e in self.out_edges if e.id == msg.edge), None)
        if edge is None:
            return
        link = self._links.get((msg.edge, msg.consumer))
        if link is None:
            return
        for token in msg.tokens:
            if token in link.outstanding:
                link.outstanding.remove(token)
                self._writer(edge_channel(self.graph, edge)).free(token)
        link.credits += msg.n
        self._credit_event.set()

    def _reset_peer(self, stage: str, replica: int) -> None:
        """A downstream replica restarted: forget what it held and talk to the new process."""
        peer = actor_name(stage, replica)
        self.outbox.reset(peer)
        for (edge_id, link_peer), link in list(self._links.items()):
            if link_peer == peer:
                edge = next(e for e in self.out_edges if e.id == edge_id)
                writer = self._writer(edge_channel(self.graph, edge))
                for token in link.outstanding:
                    writer.free(token)
                del self._links[(edge_id, link_peer)]
        self._credit_event.set()

    # ---- outbound ---------------------------------------------------------------------------

    def _writer(self, channel: str) -> Any:
        if channel not in self._writers:
            owner = shm_owner(self.instance, self.spec.name, self.replica)
            self._writers[channel] = load_channel(channel).writer(owner, self.spec.arena_bytes)
        return self._writers[channel]

    def _send(self, peer: str, msg: m.Msg, frames: list[Any] | None = None) -> bool:
        return self.outbox.send(peer, msg, frames)

    def _edge_peer(self, edge: EdgeSpec, rid: str) -> str:
        if edge.dst == OUT:
            return KERNEL
        return actor_name(edge.dst, pick_replica(rid, self.graph.stage(edge.dst).replicas))

    def _send_to_edge(self, edge: EdgeSpec, rid: str, msg: m.Msg) -> None:
        self._send(self._edge_peer(edge, rid), msg)

    async def _send_chunk(self, edge: EdgeSpec, rid: str, data: dict[str, Any], seq: int) -> None:
        peer = self._edge_peer(edge, rid)
        link = self._link(edge, peer)
        while link.credits <= 0:
            self._credit_event.clear()
            await self._credit_event.wait()
            link = self._link(edge, peer)
        meta: dict[str, Any] = {}
        payloads: list[m.PayloadDesc] = []
        frames: list[Any] = []
        tokens: list[int] = []
        try:
            for key, value in data.items():
                if not is_array(value):
                    meta[key] = value
                    continue
                desc, extra = await self._write_array(edge, key, value, link)
                if desc.channel == "inline":
                    desc.frame = len(frames)
                    frames.extend(extra)
                else:
                    tokens.append(self._reader_token(desc))
                payloads.append(desc)
        except BaseException:  # e.g. one array too large for the arena: the chunk's other slots come back
            self._free_slots(payloads)
            raise
        if self._send(peer, m.RequestChunk(rid, edge.id, meta, payloads, seq), frames):
            link.credits -= 1
            link.outstanding.extend(tokens)
        else:  # the consumer is gone: its slots come back now, the supervisor fails the request
            self._free_slots(payloads)

    def _free_slots(self, payloads: list[m.PayloadDesc]) -> None:
        for desc in payloads:
            token = self._reader_token(desc)
            if token >= 0:
                self._writer(desc.channel).free(token)

    async def _write_array(self, edge: EdgeSpec, key: str, value: Any, link: _PeerLink) -> tuple[m.PayloadDesc, list[Any]]:
        channel = edge_channel(self.graph, edge)
        nbytes = getattr(value, "nbytes", None)
        if nbytes is None and hasattr(value, "element_size"):
            nbytes = value.element_size() * value.numel()
        if edge.channel == "auto" and channel == "shm" and (nbytes or 0) <= INLINE_MAX_BYTES:
            channel = "inline"
        writer = self._writer(channel)
        while True:
            try:
                return writer.write(key, value)
            except PayloadTooLarge as exc:
                raise PayloadTooLarge(f"stage {self.spec.name} cannot send {key!r} ({nbytes} bytes) on {edge.id}: "
                                      f"{exc}") from None
            except ChannelFull:
                if not any(lk.outstanding for lk in self._links.values()):
                    raise
                self._credit_event.clear()
                await self._credit_event.wait()

    async def _emit(self, emit: Emit) -> None:
        """Send one output; whatever goes wrong while sending it fails that request, never the actor."""
        try:
            await self._send_emit(emit)
        except Exception as exc:
            if emit.rid not in self._opened:
                return
            log.warning("%s could not send the output of %s: %s: %s", self.name, emit.rid, type(exc).__name__, exc)
            self._fail(emit.rid, getattr(exc, "kind", "stage_failed"), f"{type(exc).__name__}: {exc}")

    def _fail(self, rid: str, kind: str, message: str) -> None:
        self._send(KERNEL, m.RequestError(rid, self.spec.name, kind, message))
        self.driver.post_cancel(rid)
        self._forget(rid)

    async def _send_emit(self, emit: Emit) -> None:
        rid = emit.rid
        if rid not in self._opened:  # cancelled or already finished here
            return
        if emit.error is not None:
            self._fail(rid, emit.error_kind, emit.error)
            return
        edges = self._edges_of(rid)
        if emit.data is not None:
            seq = self.driver.next_seq(rid)
            for edge in edges:  # output for a stage the request skips is dropped here
                if edge.port != emit.port:
                    continue
                if edge.mode == "final":
                    self._final_buffers.setdefault((rid, edge.id), []).append(emit.data)
                else:
                    await self._send_chunk(edge, rid, emit.data, seq)
        if emit.finish:
            for edge in edges:
                for i, data in enumerate(self._final_buffers.pop((rid, edge.id), [])):
                    await self._send_chunk(edge, rid, data, i)
                self._send_to_edge(edge, rid, m.RequestEnd(rid, edge.id, emit.end_meta or {}))
            self._forget(rid)
            self._send(KERNEL, m.RequestLeft(rid, self.spec.name, self.replica))

    def _edges_of(self, rid: str) -> list[EdgeSpec]:
        """The outgoing edges this request uses (none into a stage it skips)."""
        skip = self._skips.get(rid)
        return [e for e in self.out_edges if e.dst not in skip] if skip else self.out_edges

    def _forget(self, rid: str) -> None:
        self._opened.pop(rid, None)
        self._skips.pop(rid, None)
        for key in [k for k in self._final_buffers if k[0] == rid]:
            del self._final_buffers[key]

    # ---- the loop ----------------------------------------------------------------------------

    async def _main_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            if not self.driver.wants_step():
                self._wake.clear()
                if not self.driver.wants_step():
                    await self._wake.wait()
                    continue
            emits, credits = await loop.run_in_executor(self._pool, self.driver.run_once)
            for edge_id, producer, tokens in credits:
                self._send(producer, m.EdgeCredit(edge_id, 1, [t for t in tokens if t >= 0], self.name))
            for emit in emits:
                await self._emit(emit)

    async def _heartbeat_loop(self) -> None:
        while True:
            self._send(KERNEL, m.ActorHeartbeat(self.spec.name, self.replica, self.stats()))
            await asyncio.sleep(HEARTBEAT_S)

    def stats(self) -> dict[str, Any]:
        stats = dict(self.driver.last_stats)
        stats.update(self.driver.counters())
        stats["dropped_messages"] = self.dropped
        stats["time"] = time.time()
        return stats


def _pid() -> int:
    import os

    return os.getpid()
