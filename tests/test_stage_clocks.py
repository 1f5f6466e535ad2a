"""The stage timeline's clocks: each actor's loop lanes add up to its wall time, a producer whose
consumer is slow shows the wait in `credit_wait`, the GPU clock is a no-op off CUDA, and /metrics
exports the clocks as a counter that never goes down, not even across a restart."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from kernel_helpers import graph, run_one
from omni.api.metrics import ApiMetrics
from omni.kernel.kernel import Kernel
from omni.lane_clock import LaneClock
from omni.stages.gpu_clock import GpuClock

LANES = ("setup", "emit", "idle", "compute", "credit_wait")


def test_lanes_add_up_and_a_wait_goes_back_to_the_lane_it_left():
    clock = LaneClock("emit", ("idle",))
    t0 = time.perf_counter()
    asyncio.run(clock.wait("idle", asyncio.sleep(0.05)))
    handled = clock.timed("recv", lambda x: x + 1)
    assert handled(1) == 2
    seconds = clock.seconds()
    wall = time.perf_counter() - t0
    assert seconds["idle"] >= 0.05 and clock.enter("emit") == "emit"  # back in the base lane after the wait
    assert seconds["emit"] + seconds["idle"] == pytest.approx(wall, abs=0.01)
    assert 0 < seconds["recv"] < wall  # a side counter: time spent elsewhere on the thread


async def _clocked_run(g, prompts: int, tokens: int, mode: str = "inline"):
    async with Kernel(g, mode=mode) as kernel:
        before = await kernel.stats()
        await asyncio.gather(*(run_one(kernel, f"prompt {i}", max_tokens=tokens) for i in range(prompts)))
        after = await kernel.stats()
    return before, after


def _delta(before: dict, after: dict, actor: str) -> dict[str, float]:
    b, a = before[actor]["time_s"], after[actor]["time_s"]
    return {k: a[k] - b.get(k, 0.0) for k in a} | {"wall": after[actor]["time"] - before[actor]["time"]}


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_loop_lanes_add_up_to_the_wall_time_of_every_stage(mode):
    before, after = asyncio.run(_clocked_run(graph(), prompts=4, tokens=12, mode=mode))
    for actor in ("encoder.0", "generator.0", "vocoder.0"):
        d = _delta(before, after, actor)
        assert set(LANES) | {"recv", "step"} <= set(d), d
        lanes = sum(d[k] for k in LANES)
        assert lanes == pytest.approx(d["wall"], abs=0.02 + 0.02 * d["wall"]), (actor, d)
        assert d["setup"] == 0.0  # set-up ended before the first snapshot
        assert 0 < d["step"] <= d["compute"]  # the step runs inside the loop's wait for the compute thread
        assert d["recv"] > 0 and d["emit"] > 0 and d["idle"] > 0, (actor, d)
    assert after["generator.0"]["time_s"]["credit_wait"] == 0.0  # 64 credits: never exhausted here


def test_a_slow_consumer_shows_as_the_producers_credit_wait():
    g = graph(vocoder={"step_delay_s": 0.05, "first_chunk_frames": 1, "chunk_frames": 1})
    g.stage("vocoder").credits = 1  # one frame chunk in flight: the generator waits for each to be taken
    before, after = asyncio.run(_clocked_run(g, prompts=1, tokens=20))
    gen, voc = _delta(before, after, "generator.0"), _delta(before, after, "vocoder.0")
    # 19 of the 20 frames wait for the vocoder's previous 50 ms step to end before they are taken
    assert gen["credit_wait"] > 0.4, gen
    assert voc["step"] > 0.9 and voc["credit_wait"] == 0.0, voc  # its own exit edge has no credit limit


def test_gpu_clock_is_a_no_op_off_cuda():
    clock = GpuClock("cpu")
    clock.start()
    clock.stop()
    assert not clock.on and clock.seconds() == 0.0


def _time_samples(text: str, stage: str) -> dict[str, float]:
    out = {}
    for labels, value in re.findall(r"^omni_stage_time_seconds_total{(.*)} (\S+)$", text, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if found["stage"] == stage:
            out[found["part"]] = float(value)
    return out


def test_metrics_export_the_clocks_as_a_counter_that_survives_a_restart():
    metrics = ApiMetrics()
    up = {"pid": 11, "time_s": {"idle": 5.0, "compute": 2.0}, "steps": 7}
    first = _time_samples(metrics.render({"talker.0": up}).decode(), "talker.0")
    assert first == {"idle": 5.0, "compute": 2.0}
    later = _time_samples(metrics.render({"talker.0": {**up, "time_s": {"idle": 6.0, "compute": 2.5}}}).decode(),
                          "talker.0")
    assert later == {"idle": 6.0, "compute": 2.5}
    # restarted: a new process whose clocks start again from zero; the counter carries on from 6.0 / 2.5
    restarted = {"pid": 12, "time_s": {"idle": 0.5, "compute": 4.0}}
    after = _time_samples(metrics.render({"talker.0": restarted}).decode(), "talker.0")
    assert after == {"idle": 6.5, "compute": 6.5}
    # a replica that is down reports its last heartbeat's stats: nothing moves back
    assert _time_samples(metrics.render({"talker.0": {**restarted, "pid": 0}}).decode(), "talker.0") == after


def test_a_live_kernels_clocks_reach_metrics():
    _, after = asyncio.run(_clocked_run(graph(), prompts=1, tokens=4))
    text = ApiMetrics().render(after).decode()
    parts = _time_samples(text, "generator.0")
    assert set(LANES) | {"recv", "step"} <= set(parts) and parts["compute"] > 0
    assert re.search(r"^# TYPE omni_stage_time_seconds(_total)? counter$", text, re.M)


@pytest.mark.gpu
def test_gpu_clock_times_the_gpu_work_between_its_events_and_stays_out_of_captures():
    import torch

    clock = GpuClock("cuda")
    x = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    clock.start()
    for _ in range(20):
        x = (x @ x) * 1e-3
    clock.stop()  # never waits for the GPU: the pair is read once it has completed
    torch.cuda.synchronize()
    busy = clock.seconds()
    assert busy > 0 and not clock._pending
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # recording an event inside a capture would break it
        clock.start()
        y = x @ x
        clock.stop()
    graph.replay()
    torch.cuda.synchronize()
    assert y.isfinite().all() and clock.seconds() == busy
