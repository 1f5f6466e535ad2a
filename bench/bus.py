"""Control-bus hop latency: omni's bus against a raw pyzmq PUSH/PULL ping-pong, in one run.

Three measurements, each a ping-pong between two processes (one hop = round trip / 2):
  raw_zmq     blocking pyzmq PUSH/PULL, 64-byte payloads, no encoding
  omni_bus    omni's messages (msgspec RequestChunk) through its Mailbox / Outbox on uvloop,
              decoded on each side: what an actor's mailbox pays per hop
  omni_stage  a whole kernel round trip through one echo stage actor (kernel -> actor, compute
              thread hand-off, actor -> kernel): the cost a request really sees per stage

    python bench/bus.py [--n 5000] [--out bench/results/bus.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omni.kernel import messages as m  # noqa: E402
from omni.kernel.graph import OUT, EdgeSpec, Graph, StageSpec  # noqa: E402
from omni.kernel.stage import Emit, Stage  # noqa: E402


def _raw_echo(ping: str, pong: str, n: int) -> None:
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind(ping)
    push.connect(pong)
    for _ in range(n):
        push.send(pull.recv())
    ctx.destroy(linger=0)


def bench_raw(n: int, tmp: str) -> list[float]:
    ping, pong = f"ipc://{tmp}/raw-ping", f"ipc://{tmp}/raw-pong"
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(pong)
    proc = mp.get_context("spawn").Process(target=_raw_echo, args=(ping, pong, n))
    proc.start()
    push = ctx.socket(zmq.PUSH)
    push.connect(ping)
    payload, times = b"x" * 64, []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        push.send(payload)
        pull.recv()
        times.append((time.perf_counter_ns() - t0) / 2e3)
    proc.join()
    ctx.destroy(linger=0)
    return times


def _bus_echo(ping: str, pong: str, n: int) -> None:
    import uvloop

    from omni.kernel.bus import Mailbox, Outbox

    async def main() -> None:
        done = asyncio.get_running_loop().create_future()
        outbox = Outbox(lambda peer: pong, "echo")
        count = [0]

        def handle(msg: m.Msg, frames: list) -> None:
            outbox.send("bench", msg)
            count[0] += 1
            if count[0] == n:
                done.set_result(None)

        mailbox = Mailbox(ping, handle, "echo")
        mailbox.start()
        await done
        mailbox.close()
        outbox.close()

    uvloop.run(main())


def bench_bus(n: int, tmp: str) -> list[float]:
    """omni's Mailbox / Outbox on uvloop, msgspec-encoded RequestChunk each way."""
    import uvloop

    from omni.kernel.bus import Mailbox, Outbox

    ping, pong = f"ipc://{tmp}/bus-ping", f"ipc://{tmp}/bus-pong"
    proc = mp.get_context("spawn").Process(target=_bus_echo, args=(ping, pong, n))

    async def main() -> list[float]:
        replies: asyncio.Queue = asyncio.Queue()
        mailbox = Mailbox(pong, lambda msg, frames: replies.put_nowait(msg), "bench")
        mailbox.start()
        proc.start()
        outbox = Outbox(lambda peer: ping, "bench")
        msg, times = m.RequestChunk("r" * 32, 0, {"token_ids": [1, 2, 3]}), []
        for i in range(n):
            msg.meta["token_ids"][0] = i
            t0 = time.perf_counter_ns()
            while not outbox.send("echo", msg):  # the echo process may still be starting
                await asyncio.sleep(0.01)
                t0 = time.perf_counter_ns()
            await replies.get()
            times.append((time.perf_counter_ns() - t0) / 2e3)
        mailbox.close()
        outbox.close()
        return times

    times = uvloop.run(main())
    proc.join()
    return times


class EchoStage(Stage):
    """Finishes each request at once with one tiny chunk."""

    def setup(self) -> None:
        self.ready: list[str] = []

    def close_input(self, rid: str) -> None:
        self.ready.append(rid)

    def has_work(self) -> bool:
        return bool(self.ready)

    def step(self) -> list[Emit]:
        out = [e for rid in self.ready for e in (Emit(rid, "out", {"x": 1}), Emit(rid, finish=True))]
        self.ready = []
        return out


def bench_stage(n: int) -> list[float]:
    import uvloop

    from omni.kernel.kernel import Kernel

    graph = Graph("echo", [StageSpec("echo", "bench.bus:EchoStage")], [EdgeSpec("echo", "out", OUT)])

    async def main() -> list[float]:
        times = []
        async with Kernel(graph, mode="process") as kernel:
            for _ in range(n):
                t0 = time.perf_counter_ns()
                await kernel.submit({}).collect()
                times.append((time.perf_counter_ns() - t0) / 2e3)
        return times

    return uvloop.run(main())


def summary(times: list[float]) -> dict[str, float]:
    arr = np.asarray(times[len(times) // 10:])  # drop warm-up
    return {"p50_us": round(float(np.percentile(arr, 50)), 1), "p99_us": round(float(np.percentile(arr, 99)), 1),
            "mean_us": round(float(arr.mean()), 1), "n": int(arr.size)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--out", default="bench/results/bus.json")
    args = parser.parse_args()
    import tempfile

    tmp = tempfile.mkdtemp(prefix="omni-bench-")
    rows = {}
    for name, fn in (("raw_zmq", lambda: bench_raw(args.n, tmp)), ("omni_bus", lambda: bench_bus(args.n, tmp)),
                     ("omni_stage", lambda: bench_stage(max(args.n // 5, 200)))):
        print(f"[bus] {name} ...", file=sys.stderr, flush=True)
        rows[name] = summary(fn())
        print(f"[bus] {name}: {rows[name]}", file=sys.stderr, flush=True)
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)  # the ping-pong sockets
    raw = rows["raw_zmq"]["p50_us"]
    for row in rows.values():
        row["p50_vs_raw"] = round(row["p50_us"] / raw, 2)
    result = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
              "hop_latency": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print("| path | p50 µs | p99 µs | p50 / raw zmq |\n|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['p50_us']} | {row['p99_us']} | {row['p50_vs_raw']} |")


if __name__ == "__main__":
    main()
