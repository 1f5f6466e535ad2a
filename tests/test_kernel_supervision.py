"""Supervision and flow control: SIGKILLed stages, restart budgets, start failures, clean exits."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_helpers import graph, run_one, shm_segments
from omni.kernel.errors import StageDown, StageFailed, StageStartError
from omni.kernel.graph import StageSpec
from omni.kernel.kernel import Kernel


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie still answers kill(0): look at its state
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_sigkill_mid_request_fails_inflight_restarts_and_serves_again():
    async def main():
        g = graph("shm", generator={"step_delay_s": 0.02})
        async with Kernel(g, mode="process") as kernel:
            streams = [kernel.submit({"prompt": "long prompt " * 40, "max_tokens": 10000}) for _ in range(4)]
            first = await streams[0].__anext__()
            assert first.port == "text"
            assert shm_segments(kernel.instance)  # payloads are in flight through shm
            old_pid = kernel.pid_of("generator")
            os.kill(old_pid, signal.SIGKILL)
            t0 = time.monotonic()
            errors = []
            for stream in streams:
                with pytest.raises(StageFailed, match="generator.0 died"):
                    await stream.collect()
                errors.append(time.monotonic() - t0)
            assert not [s for s in shm_segments(kernel.instance) if "-generator-" in s]
            for _ in range(200):
                if kernel.health()["generator"] == "up":
                    break
                await asyncio.sleep(0.05)
            after = await asyncio.gather(*(run_one(kernel, f"after {i}", max_tokens=6) for i in range(3)))
            stats = await kernel.stats()
            idle = {n: s["in_flight"] for n, s in stats.items() if n != "kernel"}
            instance, pid = kernel.instance, kernel.pid_of("generator")
        return errors, after, stats, idle, instance, old_pid, pid

    errors, after, stats, idle, instance, old_pid, new_pid = asyncio.run(main())
    assert max(errors) < 2.0
    assert all(len(r["tokens"]) == 6 for r in after)
    assert stats["generator.0"]["restarts_in_window"] == 1 and new_pid != old_pid
    assert set(idle.values()) == {0}  # the other stages freed the failed requests
    assert not shm_segments(instance)
    assert not _pid_alive(new_pid)


def test_restart_budget_exhausted_marks_stage_down():
    async def main():
        g = graph()
        g.stage("vocoder").max_restarts = 1
        async with Kernel(g, mode="process") as kernel:
            for _ in range(2):
                os.kill(kernel.pid_of("vocoder"), signal.SIGKILL)
                for _ in range(100):
                    await asyncio.sleep(0.05)
                    if kernel.health()["vocoder"] in ("up", "down") and kernel.pid_of("vocoder"):
                        if kernel.health()["vocoder"] == "down" or _pid_alive(kernel.pid_of("vocoder")):
                            break
            await asyncio.sleep(0.3)
            health = kernel.health()
            with pytest.raises(StageDown, match="vocoder"):
                kernel.submit({"prompt": "p"})
        return health

    assert asyncio.run(main())["vocoder"] == "down"


def test_start_failure_names_the_stage_and_why():
    g = graph()
    g.stages.append(StageSpec("broken", "no_such_module.anywhere:Stage"))
    g.edges[0].dst = "broken"  # encoder -> broken, so the graph stays valid
    g.edges.append(type(g.edges[0])("broken", "embeds", "generator"))

    async def main():
        with pytest.raises(StageStartError, match=r"broken\.0.*ModuleNotFoundError.*no_such_module"):
            await Kernel(g, mode="process").start()

    asyncio.run(main())


def test_start_timeout_names_the_stage():
    g = graph()
    g.stage("generator").start_timeout_s = 0.001

    async def main():
        kernel = Kernel(g, mode="process")
        with pytest.raises(StageStartError, match="generator.0.*not ready within"):
            await kernel.start()
        return kernel

    kernel = asyncio.run(main())
    assert not Path(kernel.run_dir).exists() and not shm_segments(kernel.instance)


def test_graceful_shutdown_leaves_nothing():
    async def main():
        async with Kernel(graph("shm"), mode="process") as kernel:
            await run_one(kernel, "prompt " * 50)
            pids = [kernel.pid_of(s) for s in ("encoder", "generator", "vocoder")]
            assert shm_segments(kernel.instance)
        return kernel, pids

    kernel, pids = asyncio.run(main())
    assert not any(_pid_alive(p) for p in pids)
    assert not Path(kernel.run_dir).exists()
    assert not shm_segments(kernel.instance)


PARENT = """
import asyncio, json, sys
sys.path.insert(0, "tests")
from kernel_helpers import graph, run_one
from omni.kernel.kernel import Kernel
async def main():
    kernel = Kernel(graph("shm"), mode="process")
    await kernel.start()
    await run_one(kernel, "prompt " * 50)
    print(json.dumps({"instance": kernel.instance, "run_dir": kernel.run_dir,
                      "pids": [kernel.pid_of(s) for s in ("encoder", "generator", "vocoder")]}), flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""


def test_parent_crash_leaves_nothing():
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(proc.stdout.readline())
        assert shm_segments(info["instance"])
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
            any(_pid_alive(p) for p in info["pids"]) or shm_segments(info["instance"]) or Path(info["run_dir"]).exists()
        ):
            time.sleep(0.1)
        assert not any(_pid_alive(p) for p in info["pids"])
        assert not shm_segments(info["instance"])
        assert not Path(info["run_dir"]).exists()
    finally:
        proc.kill()


def test_slow_consumer_bounds_the_producer():
    """Credits: the generator cannot run ahead of a slow vocoder by more than its queue + credits."""
    async def main():
        g = graph("shm", vocoder={"step_delay_s": 0.05, "chunk_frames": 4, "first_chunk_frames": 4})
        g.stage("vocoder").max_queue = 8
        g.stage("vocoder").credits = 4
        async with Kernel(g, mode="process") as kernel:
            stream = kernel.submit({"prompt": "fast producer", "max_tokens": 5000})
            samples = []
            for _ in range(6):
                await asyncio.sleep(0.25)
                stats = await kernel.stats()
                samples.append((stats["generator.0"]["steps"], stats["vocoder.0"]["decoded_frames"],
                                stats["vocoder.0"]["backlog"]))
            await stream.cancel()
        return samples

    samples = asyncio.run(main())
    for produced, decoded, backlog in samples:
        assert produced - decoded <= 8 + 4 + 4 + 2, samples  # max_queue + credits + one chunk + slack
        assert backlog <= 8 + 4
    assert samples[-1][0] < 1000  # unthrottled, the generator would be done with 5000 steps


def test_a_hung_stage_is_found_by_heartbeats_and_restarted():
    """SIGSTOP freezes the process without killing it: only missing heartbeats reveal it."""
    async def main():
        async with Kernel(graph(generator={"step_delay_s": 0.01}), mode="process", heartbeat_timeout_s=1.0) as kernel:
            stream = kernel.submit({"prompt": "p", "max_tokens": 100000})
            await stream.__anext__()
            frozen = kernel.pid_of("generator")
            os.kill(frozen, signal.SIGSTOP)
            t0 = time.monotonic()
            with pytest.raises(StageFailed, match="generator.0 died"):
                await stream.collect()
            waited = time.monotonic() - t0
            for _ in range(200):
                if kernel.health()["generator"] == "up":
                    break
                await asyncio.sleep(0.05)
            after = await run_one(kernel, "after the hang", max_tokens=3)
        return waited, after, frozen

    waited, after, frozen = asyncio.run(main())
    assert 0.5 < waited < 4.0
    assert len(after["tokens"]) == 3 and not _pid_alive(frozen)
