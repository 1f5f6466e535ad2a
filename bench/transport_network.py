"""The network channel (ZeroMQ frames over TCP) beside shm (descriptor over ipc://), across a spawned
consumer on this machine's loopback: one-way latency (half a round trip: chunk there, credit back)
and throughput (16 chunks in flight) per payload size.

    python bench/transport_network.py [--sizes 1024 65536 1048576] [--seconds 1]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from omni.transport.channels import ChannelFull, load_channel  # noqa: E402
from omni.kernel.messages import EdgeCredit, RequestChunk, decode, encode  # noqa: E402
from omni.transport.shm import unlink_prefix  # noqa: E402

IN_FLIGHT = 16


def consumer(channel: str, into: str, back: str) -> None:
    ctx = zmq.Context.instance()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.connect(into)
    push.connect(back)
    reader = load_channel(channel).reader()
    while True:
        frames = pull.recv_multipart(copy=False)
        if frames[0].bytes == b"stop":
            break
        desc = decode(frames[0].buffer).payloads[0]
        float(reader.read(desc, frames[1:])[-1])  # touch it
        push.send(encode(EdgeCredit(0, "c", [reader.token(desc)])))
    reader.close()


def bench(channel: str, size: int, seconds: float) -> tuple[float, float]:
    ctx = zmq.Context.instance()
    scheme = "tcp://127.0.0.1:*" if channel == "network" else f"ipc:///tmp/omni-bench-{uuid.uuid4().hex[:8]}"
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    push.bind(scheme if channel == "network" else scheme + "-in")
    pull.bind(scheme if channel == "network" else scheme + "-out")
    proc = mp.get_context("spawn").Process(target=consumer, args=(
        channel, push.getsockopt_string(zmq.LAST_ENDPOINT), pull.getsockopt_string(zmq.LAST_ENDPOINT)), daemon=True)
    proc.start()
    owner = f"omni-bench-{uuid.uuid4().hex[:8]}"
    writer = load_channel(channel).writer(owner, max(64 << 20, size * IN_FLIGHT * 2))
    array = np.ones(size // 4, dtype=np.float32)

    def send() -> None:
        desc, frames = writer.write("x", array)
        desc.frame = 0 if frames else -1
        push.send_multipart([encode(RequestChunk("r", 0, payloads=[desc])), *frames], copy=False)

    def credit() -> None:
        writer.free(decode(pull.recv()).tokens[0])

    send(); credit()  # warm up: the consumer maps / connects
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds / 2:
        send(); credit(); n += 1
    latency_us = (time.perf_counter() - t0) / n / 2 * 1e6
    sent = done = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds / 2 or done < sent:
        while sent - done < IN_FLIGHT and time.perf_counter() - t0 < seconds / 2:
            try:
                send(); sent += 1
            except ChannelFull:
                break
        credit(); done += 1
    gbs = done * size / (time.perf_counter() - t0) / 1e9
    push.send(b"stop")
    proc.join(10)
    writer.close()
    unlink_prefix(owner + "-")
    push.close(0); pull.close(0)
    return latency_us, gbs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1 << 10, 1 << 16, 1 << 20, 4 << 20])
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    print("| size | shm latency (us) | network latency (us) | shm GB/s | network GB/s |\n|---|---|---|---|---|")
    for size in args.sizes:
        (sl, sg), (nl, ng) = bench("shm", size, args.seconds), bench("network", size, args.seconds)
        print(f"| {size} | {sl:.0f} | {nl:.0f} | {sg:.2f} | {ng:.2f} |", flush=True)


if __name__ == "__main__":
    main()
