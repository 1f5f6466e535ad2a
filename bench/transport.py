"""Transport benchmark: what the payload channels cost against a plain memcpy.

Sections (each a function returning {"name", "title", "columns", "rows", "notes"}; append more
to SECTIONS, e.g. control-bus hop latency):
- shm: bytes/s of the shm channel, in one process (write + zero-copy read + free) and across a
  spawned consumer process that copies every byte out of its view before it returns the credit
  (what a stage that consumes its input does), against np.copyto and a multiprocessing pipe.
- cuda_ipc (only where CUDA is available): write into the pool + a consumer process that copies
  each view into its own tensor, against a device-to-device copy_.

Run:  .venv/bin/python bench/transport.py [--quick] [--out bench/results/transport.json]
      [--md bench/RESULTS_transport.md]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from omni.transport.channels import ChannelFull  # noqa: E402
from omni.kernel.messages import RequestChunk, decode, encode  # noqa: E402
from omni.transport.shm import ShmChannel, unlink_prefix  # noqa: E402
from report import machine, md_table, write  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
SIZES = [64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB]
GB_GUESS = 2e9  # bytes/s, only to size the number of chunks per measurement
IN_FLIGHT = 4  # chunks the producer may have outstanding (arena = IN_FLIGHT slots + slack)


def human(nbytes: int) -> str:
    if nbytes >= MiB:
        return f"{nbytes / MiB:g} MiB"
    return f"{nbytes / KiB:g} KiB" if nbytes >= KiB else f"{nbytes} B"


def timed_loop(fn: Callable[[], Any]) -> Callable[[int], float]:
    """A batch runner for `measure`: `n` calls of `fn`, seconds taken."""

    def run(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t0

    return run


def measure(batches: dict[str, Callable[[int], float]], budget_s: float, rounds: int) -> dict[str, float]:
    """Median seconds per item of each batch runner, the runners interleaved round by round so
    that the load of a shared machine hits all of them alike."""
    per_batch = budget_s / rounds
    sizes = {}
    for name, run in batches.items():  # warm up, then size each batch to ~per_batch seconds
        run(1)
        one = max(run(2) / 2, 1e-7)
        sizes[name] = max(2, int(per_batch / one))
    samples: dict[str, list[float]] = {name: [] for name in batches}
    for _ in range(rounds):
        for name, run in batches.items():
            samples[name].append(run(sizes[name]) / sizes[name])
    return {name: statistics.median(values) for name, values in samples.items()}


def gbps(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 2)


# ---- consumer processes ----------------------------------------------------------------------


def _shm_consumer(conn) -> None:
    """Serves the producer: for each descriptor, reads the view and touches one byte per page
    (b"T") or copies every byte out (b"C"), then returns the token; b"P" is the pipe baseline."""
    reader = ShmChannel.reader()
    sink = np.empty(0, dtype=np.uint8)
    while (data := conn.recv_bytes()) != b"stop":
        mode, body = data[:1], data[1:]
        if mode == b"P":  # the bytes themselves come through the pipe
            buf = bytearray(int(body))
            conn.recv_bytes_into(buf)
            conn.send_bytes(b"ok")
            continue
        desc = decode(body).payloads[0]
        view = reader.read(desc, [])
        if mode == b"T":
            int(view[::4096].sum())
        else:
            if sink.size < view.size:
                sink = np.empty(view.size, dtype=np.uint8)
            np.copyto(sink[: view.size], view)
        del view
        conn.send_bytes(reader.token(desc).to_bytes(8, "little"))
    reader.close()


def stream_runner(writer: Any, conn: Any, src: Any, mode: bytes) -> Callable[[int], float]:
    """A batch runner: push n chunks through `writer` to the consumer, at most IN_FLIGHT
    outstanding (waiting for a credit whenever the arena is full), until all came back."""

    def run(n: int) -> float:
        in_flight = sent = 0
        t0 = time.perf_counter()
        while sent < n or in_flight:
            if sent < n and in_flight < IN_FLIGHT:
                try:
                    desc, _ = writer.write("x", src)
                except ChannelFull:
                    desc = None
                if desc is not None:
                    conn.send_bytes(mode + encode(RequestChunk(rid="b", edge=0, payloads=[desc])))
                    sent += 1
                    in_flight += 1
                    continue
            writer.free(int.from_bytes(conn.recv_bytes(), "little"))  # wait for one credit
            in_flight -= 1
            while in_flight and conn.poll(0):  # and take the others already there
                writer.free(int.from_bytes(conn.recv_bytes(), "little"))
                in_flight -= 1
        return time.perf_counter() - t0

    return run


def pipe_runner(conn: Any, src: np.ndarray) -> Callable[[int], float]:
    def run(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            conn.send_bytes(b"P%d" % src.nbytes)
            conn.send_bytes(src)
            conn.recv_bytes()
        return time.perf_counter() - t0

    return run


# ---- sections --------------------------------------------------------------------------------


def bench_shm(args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    consumer = ctx.Process(target=_shm_consumer, args=(child_conn,), daemon=True)
    consumer.start()
    owner = f"omni-bench-{uuid.uuid4().hex[:8]}"
    rows = []
    try:
        for size in args.sizes:
            src = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
            dst = np.empty_like(src)
            rotating = itertools.cycle([np.empty_like(src) for _ in range(IN_FLIGHT)])
            writer = ShmChannel.writer(owner, IN_FLIGHT * size + MiB)
            reader = ShmChannel.reader()

            def local_round() -> None:
                desc, _ = writer.write("x", src)
                reader.read(desc, [])
                writer.free(reader.token(desc))

            t = measure(
                {
                    "memcpy": timed_loop(lambda: np.copyto(dst, src)),
                    "memcpy_rot": timed_loop(lambda: np.copyto(next(rotating), src)),
                    "local": timed_loop(local_round),
                    "touch": stream_runner(writer, conn, src, b"T"),
                    "copyout": stream_runner(writer, conn, src, b"C"),
                    "pipe": pipe_runner(conn, src),
                },
                args.budget,
                args.rounds,
            )
            reader.close()
            writer.close()
            row = {"size": human(size), "bytes": size, "memcpy_GBps": gbps(size, t["memcpy"])}
            row[f"memcpy_rot{IN_FLIGHT}_GBps"] = gbps(size, t["memcpy_rot"])
            for key, column in (("local", "shm_local"), ("touch", "shm_cross_touch"), ("copyout", "shm_cross_copyout")):
                row[f"{column}_GBps"] = gbps(size, t[key])
                row[f"{column}_x"] = round(t["memcpy"] / t[key], 2)
            row["pipe_GBps"] = gbps(size, t["pipe"])
            rows.append(row)
            print(f"  shm {row['size']:>7}: " + ", ".join(f"{k}={v}" for k, v in row.items() if k not in ("size", "bytes")), flush=True)
    finally:
        conn.send_bytes(b"stop")
        consumer.join(10)
        if consumer.is_alive():
            consumer.kill()
        unlink_prefix(owner + "-")
    return {
        "name": "shm",
        "title": "shm channel vs memcpy (GB/s, higher is better)",
        "columns": list(rows[0]) if rows else [],
        "rows": rows,
        "notes": (
            "Payload bytes per second; `_x` columns are the ratio to memcpy (1.0 = as fast). memcpy: "
            "np.copyto between two private buffers (cache-resident below the LLC size, as is the reused "
            f"arena slot of shm_local); memcpy_rot{IN_FLIGHT}: the same into {IN_FLIGHT} destinations in turn "
            "(the working set of the cross-process arena). shm_local: write (one copy into the arena) + zero-copy read + free, one process. "
            "shm_cross_*: the producer writes, a spawned consumer reads the view and either touches one "
            "byte per 4 KiB page (touch) or copies every byte out (copyout), then returns the credit; up "
            f"to {IN_FLIGHT} chunks in flight, descriptors and credits over a multiprocessing pipe. pipe: "
            "the same bytes sent through that pipe (send_bytes/recv_bytes_into) instead. All runs "
            "interleaved round by round; medians of the rounds."
        ),
    }


def _cuda_consumer(conn) -> None:
    import torch

    from omni.transport.cuda_ipc import CudaIpcChannel

    reader = CudaIpcChannel.reader()
    sink = None
    while (data := conn.recv_bytes()) != b"stop":
        mode, desc = data[:1], decode(data[1:]).payloads[0]
        view = reader.read(desc, [])
        if mode == b"C":
            if sink is None or sink.numel() < view.numel():
                sink = torch.empty(view.numel(), dtype=torch.uint8, device=view.device)
            sink[: view.numel()].copy_(view)
        del view
        reader.fence()  # the producer's copy (and ours) must be done before the slot goes back
        conn.send_bytes(reader.token(desc).to_bytes(8, "little"))
    reader.close()


def bench_cuda_ipc(args: argparse.Namespace) -> dict[str, Any] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from omni.transport.cuda_ipc import CudaIpcChannel, unlink_process_leftovers

    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    consumer = ctx.Process(target=_cuda_consumer, args=(child_conn,), daemon=True)
    consumer.start()
    owner = f"omni-bench-{uuid.uuid4().hex[:8]}"
    rows = []
    try:
        for size in args.sizes:
            src = torch.randint(0, 255, (size,), dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)

            def d2d() -> None:
                dst.copy_(src)
                torch.cuda.synchronize()

            writer = CudaIpcChannel.writer(owner, IN_FLIGHT * size + MiB)
            t = measure(
                {
                    "d2d": timed_loop(d2d),
                    "touch": stream_runner(writer, conn, src, b"T"),
                    "copyout": stream_runner(writer, conn, src, b"C"),
                },
                args.budget,
                args.rounds,
            )
            writer.close()
            row = {
                "size": human(size),
                "bytes": size,
                "d2d_copy_GBps": gbps(size, t["d2d"]),
                "cuda_ipc_cross_sync_GBps": gbps(size, t["touch"]),
                "cuda_ipc_cross_sync_x": round(t["d2d"] / t["touch"], 2),
                "cuda_ipc_cross_copyout_GBps": gbps(size, t["copyout"]),
                "cuda_ipc_cross_copyout_x": round(t["d2d"] / t["copyout"], 2),
            }
            rows.append(row)
            print(f"  cuda_ipc {row['size']:>7}: " + ", ".join(f"{k}={v}" for k, v in row.items() if k not in ("size", "bytes")), flush=True)
    finally:
        conn.send_bytes(b"stop")
        consumer.join(20)
        if consumer.is_alive():
            consumer.kill()
            consumer.join(10)
        unlink_prefix(owner + "-")
        unlink_process_leftovers(consumer.pid)
    return {
        "name": "cuda_ipc",
        "title": f"cuda_ipc channel vs a device copy on {torch.cuda.get_device_name()} (GB/s of payload)",
        "columns": list(rows[0]) if rows else [],
        "rows": rows,
        "notes": (
            "d2d_copy: dst.copy_(src) + synchronize, one process. cuda_ipc_cross_*: the producer copies into "
            "its pool and records an event; a spawned consumer reads the view (its stream waits on the event "
            "unless it has completed), optionally copies it into its own tensor (copyout), synchronizes "
            f"(reader.fence) and returns the credit (sync column: no copy); up to {IN_FLIGHT} in flight over a "
            "multiprocessing pipe. `_x`: ratio to d2d_copy. Without MPS the GPU time-slices between the two "
            "processes' contexts whenever both launch work, which is what the copyout column pays for."
        ),
    }


SECTIONS: list[Callable[[argparse.Namespace], dict[str, Any] | None]] = [bench_shm, bench_cuda_ipc]


# ---- report ----------------------------------------------------------------------------------


def markdown(report: dict[str, Any]) -> str:
    lines = ["## Transport", "", f"Command: `{report['command']}`  ", f"Date: {report['date']}  "]
    m = report["machine"]
    lines.append(f"Machine: {m.get('cpu_model') or m['processor']}, {m['cpu_count']} CPUs, {m['platform']}"
                 + (f", {m['gpu']}" if "gpu" in m else ""))
    for section in report["sections"]:
        cols = [c for c in section["columns"] if c != "bytes"]
        lines += ["", f"### {section['title']}", "", *md_table(cols, section["rows"], fmt=str)]
        lines += ["", section["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short timings (smoke run)")
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="payload sizes in bytes")
    parser.add_argument("--only", nargs="+", metavar="SECTION", help="run only these sections, e.g. bench_shm")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds per measurement")
    parser.add_argument("--out", default=str(ROOT / "bench/results/transport.json"))
    parser.add_argument("--md", default=str(ROOT / "bench/RESULTS_transport.md"))
    args = parser.parse_args(argv)
    args.budget = 0.25 if args.quick else 2.0  # seconds per measurement, split across its rounds
    if args.quick:
        args.rounds = 3
    report = {
        "command": " ".join([os.path.relpath(sys.executable, os.getcwd()) if sys.executable.startswith(os.getcwd()) else sys.executable] + sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sections": [],
    }
    for section in SECTIONS:
        if args.only and section.__name__ not in args.only:
            continue
        print(f"[{section.__name__}]", flush=True)
        result = section(args)
        if result is not None:
            report["sections"].append(result)
        else:
            print("  skipped (not available here)", flush=True)
    report["machine"] = machine()
    write(report, args.out, args.md, markdown)
    print(f"wrote {args.out} and {args.md}")
    return report


if __name__ == "__main__":
    main()
