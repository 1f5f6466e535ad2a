"""Requests across the replicas of a stage, end to end (omni/cluster/balancer.py through the kernel and
its actors): spread by load, each request on one replica for its whole life (its chunks, its end, its
credits back through shm), a session's turns on one replica however loaded it is, a replica restarting
never chosen while the other is up, and the same through /v1/realtime, whose turns carry the session."""

from __future__ import annotations

import asyncio
import time
import zlib

import numpy as np
import pytest

from omni.cluster.balancer import SESSION
from omni.kernel.errors import StageFailed
from omni.kernel.graph import OUT, EdgeSpec, Graph, StageSpec
from omni.kernel.kernel import Kernel
from omni.kernel.stage import Emit, Stage
from omni.kernel.supervisor import ActorState


class Front(Stage):
    """One replica: passes each request on to the workers as an array (an shm slot to credit back)."""

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.out: list[Emit] = []

    def close_input(self, rid):
        self.out += [Emit(rid, "x", {"x": np.arange(4, dtype=np.int64)}), Emit(rid, finish=True)]

    def has_work(self):
        return bool(self.out)

    def step(self):
        out, self.out = self.out, []
        return out


class Worker(Stage):
    """Answers with its replica (a 4 KiB array through shm to the client); a request with `hold` is kept
    open (in flight, loading this replica) until it is cancelled."""

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.out: list[Emit] = []
        self.hold: dict[str, bool] = {}

    def open(self, rid, params):
        self.hold[rid] = bool(params.get("hold"))
        assert SESSION not in params or isinstance(params[SESSION], str)

    def feed(self, rid, port, data):
        assert data["x"].tolist() == [0, 1, 2, 3]
        self.out.append(Emit(rid, "out", {"replica": np.full(512, self.ctx.replica, np.int64)}))

    def close_input(self, rid):
        if not self.hold.pop(rid):
            self.out.append(Emit(rid, finish=True))

    def abort(self, rid):
        self.hold.pop(rid, None)

    def has_work(self):
        return bool(self.out)

    def step(self):
        out, self.out = self.out, []
        return out


def two_workers() -> Graph:
    return Graph("pair", [
        StageSpec("front", f"{__name__}:Front"),
        # room for one answer a replica: a slot credited back to the wrong replica stalls the other at once;
        # a death rests it 1.5 s (down) before its restart
        StageSpec("worker", f"{__name__}:Worker", replicas=2, credits=2, arena_bytes=4096, max_restarts=0,
                  restart_cooldown_s=1.5),
    ], [
        EdgeSpec("front", "x", "worker", channel="shm"),
        EdgeSpec("worker", "out", OUT, channel="shm"),
    ])


def crc_rids(prefix: str, replica: int, n: int) -> list[str]:
    """Request ids that crc32(rid) % 2, the routing this replaced, would all have sent to `replica`."""
    rids, i = [], 0
    while len(rids) < n:
        if zlib.crc32(f"{prefix}{i}".encode()) % 2 == replica:
            rids.append(f"{prefix}{i}")
        i += 1
    return rids


async def replica_of_first(stream) -> int:
    event = await stream.__anext__()
    return int(event.data["replica"][0])


async def served_by(kernel: Kernel, params: dict, rid: str) -> int:
    events = await kernel.submit(params, rid=rid).collect()
    replicas = {int(e.data["replica"][0]) for e in events if not e.final}
    assert len(replicas) == 1, replicas
    return replicas.pop()


async def until_state(kernel: Kernel, name: str, state: ActorState, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while kernel.supervisor.handles[name].state is not state:
        assert time.monotonic() < deadline, kernel.health()
        await asyncio.sleep(0.01)


def test_requests_spread_by_load_and_a_session_keeps_its_replica():
    async def main():
        async with Kernel(two_workers(), mode="inline") as kernel:
            held = {}
            for rid in crc_rids("hold", 0, 4):  # crc32 would have put all four on worker.0
                stream = kernel.submit({"hold": True}, rid=rid)
                held[rid] = (stream, await replica_of_first(stream))
            assert [r for _, r in held.values()] == [0, 1, 0, 1]
            assert kernel.balancer.load("worker.0") == kernel.balancer.load("worker.1") == 2
            for stream, r in held.values():  # free worker.0: the next ones go there however their ids hash
                if r == 0:
                    await stream.cancel()
            assert [await served_by(kernel, {}, rid) for rid in crc_rids("quick", 1, 3)] == [0, 0, 0]

            turn1 = kernel.submit({"hold": True, SESSION: "S"}, rid="turn1")
            assert await replica_of_first(turn1) == 0  # worker.1 holds two
            for stream, r in held.values():
                if r == 1:
                    await stream.cancel()  # now worker.1 is idle and worker.0 holds the session's turn 1
            assert kernel.balancer.load("worker.0") == 1 and kernel.balancer.load("worker.1") == 0
            assert await served_by(kernel, {SESSION: "S"}, "turn2") == 0  # affinity over load
            assert await served_by(kernel, {}, "loner") == 1  # least-loaded, as before

            kernel.kill("worker", 0)  # the session's replica dies: turn 1 fails with it
            with pytest.raises(StageFailed, match="worker.0"):
                async for _ in turn1:
                    pass
            await until_state(kernel, "worker.0", ActorState.DOWN)
            assert await served_by(kernel, {SESSION: "S"}, "turn3") == 1  # not StageDown: the other is up
            assert await served_by(kernel, {}, "while-down") == 1
            await until_state(kernel, "worker.0", ActorState.UP)
            assert await served_by(kernel, {SESSION: "S"}, "turn4") == 1  # remembered where it moved
            assert await served_by(kernel, {}, "after") == 0  # the restarted replica serves again
            assert kernel.balancer.load("worker.0") == kernel.balancer.load("worker.1") == 0
            assert kernel.inflight == 0

    asyncio.run(asyncio.wait_for(main(), 30))


def test_many_concurrent_requests_split_evenly_and_release_every_slot():
    """A burst of 40 requests: 20 a replica (each submitted while the others are in flight), every chunk's
    credit back to the replica that sent it (the shm slots: a lost one would stall the small credits)."""
    async def main():
        async with Kernel(two_workers(), mode="inline") as kernel:
            streams = [kernel.submit({"hold": True}, rid=f"burst{i}") for i in range(40)]
            replicas = [await replica_of_first(s) for s in streams]
            for s in streams:
                await s.cancel()
            for round_ in range(3):  # and they still serve, over the same links
                assert await served_by(kernel, {}, f"after{round_}") == 0
            stats = await kernel.stats()
            return replicas, stats

    replicas, stats = asyncio.run(asyncio.wait_for(main(), 30))
    assert replicas.count(0) == replicas.count(1) == 20
    assert stats["kernel"]["in_flight"] == 0


# ---- through /v1/realtime: the demo with two generator replicas -------------------------------------

def realtime(server):
    import openai

    client = openai.AsyncOpenAI(api_key="unused", base_url=server.url + "/v1", max_retries=0,
                                websocket_base_url=server.url.replace("http://", "ws://") + "/v1")
    return client.beta.realtime.connect(model=server.info.id)


async def answer(conn) -> None:
    await conn.conversation.item.create(item={"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": "hi"}]})
    await conn.response.create(response={"modalities": ["text"]})
    async for event in conn:
        assert event.type != "error", event.error
        if event.type == "response.done":
            assert event.response.status in ("completed", "incomplete")
            return


def test_a_realtime_sessions_turns_stay_on_one_generator_replica():
    """Two sessions land on the two generator replicas; with a long request making session a's replica the
    busier one, a's next turn still goes there (its prefix cache), b's to its own."""
    pytest.importorskip("websockets")
    from test_api_support import LiveServer

    with LiveServer(mode="inline", stage_args={"generator": {"step_delay_s": 0.005}},
                    spec_changes={"generator": {"replicas": 2}}) as srv:
        kernel = srv.kernel

        async def start_long() -> str:
            kernel.submit({"prompt": "go on", "max_tokens": 1 << 20, "modalities": ["text"]}, rid="long")
            return kernel.balancer.replica("long", "generator")

        async def go():
            async with realtime(srv) as a, realtime(srv) as b:
                ids = [(await a.recv()).session.id, (await b.recv()).session.id]
                await answer(a)  # every replica idle: generator.0
                await answer(b)  # idle again: the one no session is bound to, generator.1
                assert srv.run(start_long()) == "generator.0"  # load and sessions tie: the lowest index
                for _ in range(2):
                    await answer(a)  # generator.0, though it is the busier
                    await answer(b)
                srv.run(kernel.cancel("long"))
                return ids

        ids = asyncio.run(asyncio.wait_for(go(), 60))
        stats = srv.run(kernel.stats())
        assert [kernel.balancer.session_of(i) for i in ids] == [{"generator": 0}, {"generator": 1}]
        assert stats["generator.0"]["completed"] == stats["generator.1"]["completed"] == 3
