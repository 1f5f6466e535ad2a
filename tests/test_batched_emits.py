"""Batched emits (`Emit(rows=...)`): one step's chunks of many requests travel as one bus message per
edge and consumer replica, and each consumer feeds them as the requests' own chunks: every frame
once and in order, credits kept, the right replica, on every CPU channel; a cancelled or failed
request's rows are dropped while the others are delivered."""

from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np
import pytest

from omni.kernel import actor as actor_module
from omni.kernel import messages as m
from omni.kernel.errors import InvalidRequest, RequestCancelled
from omni.kernel.graph import OUT, EdgeSpec, Graph, StageSpec
from omni.kernel.kernel import Kernel
from omni.kernel.stage import Emit, Stage


class FrameSource(Stage):
    """Each step: one frame [request number, frame index] for every open request, as ONE batched emit."""

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.todo: dict[str, list[int]] = {}  # rid -> [number, frames left, next index]

    def open(self, rid, params):
        self.todo[rid] = [params["number"], params["frames"], 0]

    def abort(self, rid):
        self.todo.pop(rid, None)

    def has_work(self):
        return bool(self.todo)

    def step(self):
        rows = list(self.todo)
        frames = np.array([[self.todo[r][0], self.todo[r][2]] for r in rows], dtype=np.int64)
        emits = [Emit("", "frames", {"frame": frames, "kind": "codes"}, rows=rows)]
        for rid in rows:
            state = self.todo[rid]
            state[1], state[2] = state[1] - 1, state[2] + 1
            if state[1] == 0:
                del self.todo[rid]
                emits.append(Emit(rid, finish=True))
        return emits


class FrameSink(Stage):
    """Passes each fed frame on to the client, tagged with its replica; `poison_at` fails a request."""

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.out: list[Emit] = []
        self.poison: dict[str, int] = {}

    def open(self, rid, params):
        self.poison[rid] = params.get("poison_at", -1)

    def feed(self, rid, port, data):
        frame = data["frame"]
        assert frame.shape == (1, 2) and data["kind"] == "codes"
        if int(frame[0, 1]) == self.poison[rid]:
            raise InvalidRequest(f"poisoned frame {int(frame[0, 1])}")
        self.out.append(Emit(rid, "out", {"frame": frame.copy(), "replica": self.ctx.replica}))

    def close_input(self, rid):
        self.out.append(Emit(rid, finish=True))

    def has_work(self):
        return bool(self.out)

    def step(self):
        out, self.out = self.out, []
        return out


def frame_graph(channel: str, replicas: int = 2, credits: int = 64) -> Graph:
    return Graph("frames", [
        StageSpec("source", f"{__name__}:FrameSource"),
        StageSpec("sink", f"{__name__}:FrameSink", replicas=replicas, credits=credits),
    ], [
        EdgeSpec("source", "frames", "sink", channel=channel),
        EdgeSpec("source", "frames", OUT, mode="final"),  # rows buffered per request
        EdgeSpec("sink", "out", OUT),
    ])


@pytest.fixture
def chunk_messages(monkeypatch):
    """How many RequestChunk messages each actor received, and how many rows they held."""
    counts: Counter = Counter()
    dispatch = actor_module.Actor._dispatch

    def counting(self, msg, frames):
        if isinstance(msg, m.RequestChunk):
            counts[self.name, "messages"] += 1
            counts[self.name, "rows"] += len(msg.rows) or 1
        return dispatch(self, msg, frames)

    monkeypatch.setattr(actor_module.Actor, "_dispatch", counting)
    return counts


async def _collect(kernel: Kernel, rid: str, params: dict) -> list | Exception:
    try:
        return await kernel.submit(params, rid=rid).collect()
    except Exception as exc:
        return exc


def _frames(events, port: str) -> list[list[int]]:
    return [row for e in events if e.port == port for row in e.data["frame"].tolist()]


@pytest.mark.parametrize("channel", ["inline", "shm"])
@pytest.mark.parametrize("credits", [1, 64])
def test_batched_emits_deliver_every_frame_once_in_order_to_its_replica(channel, credits, chunk_messages):
    lengths = {f"req-{i}": 3 + (i * 5) % 11 for i in range(12)}

    async def main():
        async with Kernel(frame_graph(channel, credits=credits), mode="inline") as kernel:
            jobs = [_collect(kernel, rid, {"number": i, "frames": n}) for i, (rid, n) in enumerate(lengths.items())]
            return await asyncio.gather(*jobs)

    results = asyncio.run(main())
    used = set()
    for i, (rid, events) in enumerate(zip(lengths, results)):
        assert not isinstance(events, Exception), events
        expected = [[i, k] for k in range(lengths[rid])]
        assert _frames(events, "out") == expected  # through the sink: once each, in order
        assert _frames(events, "frames") == expected  # the final edge: buffered per request
        replicas = {e.data["replica"] for e in events if e.port == "out"}
        assert len(replicas) == 1  # one replica for the request's whole life
        used |= replicas
    assert used == {0, 1}  # the requests went to both
    rows = sum(v for (name, kind), v in chunk_messages.items() if name.startswith("sink") and kind == "rows")
    messages = sum(v for (name, kind), v in chunk_messages.items() if name.startswith("sink") and kind == "messages")
    assert rows == sum(lengths.values())
    steps = max(lengths.values())
    assert messages <= 2 * steps < rows  # one message per step and replica, not one per frame


def test_a_cancelled_or_failed_request_loses_its_rows_alone(chunk_messages):
    async def main():
        async with Kernel(frame_graph("shm", credits=2), mode="inline") as kernel:
            poisoned = _collect(kernel, "poisoned", {"number": 0, "frames": 30, "poison_at": 4})
            stream = kernel.submit({"number": 1, "frames": 10_000}, rid="cancelled")
            others = [_collect(kernel, f"ok-{i}", {"number": 2 + i, "frames": 40}) for i in range(4)]
            tasks = [asyncio.ensure_future(j) for j in (poisoned, *others)]
            first = await stream.__anext__()
            await stream.cancel()
            with pytest.raises(RequestCancelled):
                async for _ in stream:
                    pass
            return first, await asyncio.gather(*tasks)

    first, (poisoned, *others) = asyncio.run(main())
    assert first.data["frame"].tolist()[0][0] == 1
    assert isinstance(poisoned, InvalidRequest) and "poisoned frame 4" in str(poisoned)
    for i, events in enumerate(others):
        assert not isinstance(events, Exception), events
        assert _frames(events, "out") == [[2 + i, k] for k in range(40)]
