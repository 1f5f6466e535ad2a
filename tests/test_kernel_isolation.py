"""One request never hurts another inside the kernel, in both modes: an output that cannot be sent
fails only its request (the actor lives on); a dead stage fails only the requests that hold state in
it or still need it; a stage past its restart budget rests, then comes back, and requests that do
not need it are served meanwhile."""

from __future__ import annotations

import asyncio

import pytest

from kernel_helpers import graph, run_one, summarize
from omni.kernel.errors import InvalidRequest, PayloadTooLarge, StageDown, StageFailed
from omni.kernel.kernel import Kernel


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_payload_larger_than_the_arena_fails_only_its_request(mode):
    """The encoder's embeddings of a 10k-character prompt (1.3 MB) cannot fit its 1 MiB arena."""
    async def main():
        g = graph("shm", generator={"step_delay_s": 0.01})
        g.stage("encoder").arena_bytes = 1 << 20
        async with Kernel(g, mode=mode) as kernel:
            pid = kernel.pid_of("encoder")
            live = asyncio.ensure_future(run_one(kernel, "a small one", max_tokens=20))
            await asyncio.sleep(0.05)
            with pytest.raises(PayloadTooLarge, match=r"encoder.*embeds.*arena_bytes"):
                await kernel.submit({"prompt": "x" * 10_000, "max_tokens": 2}).collect()
            after = await run_one(kernel, "after it", max_tokens=3)
            stats = await kernel.stats()
            return await live, after, stats, pid, kernel.pid_of("encoder"), kernel.health()

    live, after, stats, pid, pid_after, health = asyncio.run(main())
    assert len(live["tokens"]) == 20 and len(after["tokens"]) == 3
    assert pid_after == pid and stats["encoder.0"]["restarts_in_window"] == 0 and set(health.values()) == {"up"}
    assert stats["encoder.0"]["in_flight"] == 0


TEXT = {"modalities": ["text"]}


async def _until(predicate, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_a_dead_stage_fails_only_the_requests_in_it(mode):
    """Killing the vocoder: text-only requests (which skip it) go on and new ones are served while it
    restarts; a speech request fails. Killing the encoder: requests that left it (decoding in the
    generator) complete."""
    async def main():
        g = graph("shm", generator={"step_delay_s": 0.02})
        async with Kernel(g, mode=mode) as kernel:
            texts = [asyncio.ensure_future(run_one(kernel, f"text {i}", max_tokens=40, **TEXT)) for i in range(3)]
            speech = kernel.submit({"prompt": "speak", "max_tokens": 10_000})
            await speech.__anext__()
            kernel.kill("vocoder")
            with pytest.raises(StageFailed, match="vocoder.0 died"):
                await speech.collect()
            assert kernel.health()["vocoder"] != "up"
            with pytest.raises(StageDown, match="vocoder"):
                kernel.submit({"prompt": "speak", "max_tokens": 2})
            during = await run_one(kernel, "while it restarts", max_tokens=3, **TEXT)
            await _until(lambda: kernel.health()["vocoder"] == "up")
            streams = [kernel.submit({"prompt": f"decoding {i}", "max_tokens": 40}) for i in range(3)]
            firsts = [await s.__anext__() for s in streams]
            await _until(lambda: all("encoder" not in kernel.holders(s.rid) for s in streams))
            kernel.kill("encoder")
            decoding = [summarize([first, *await s.collect()]) for first, s in zip(firsts, streams)]
            done = [*await asyncio.gather(*texts), *decoding]
            await _until(lambda: set(kernel.health().values()) == {"up"})
            after = await run_one(kernel, "after both", max_tokens=4)
            return done, during, after, (await kernel.stats())["kernel"]["restarts_total"]

    done, during, after, restarts = asyncio.run(main())
    assert [len(r["tokens"]) for r in done] == [40] * 6
    assert all(len(r["audio"]) == 0 for r in done[:3]) and all(len(r["audio"]) > 0 for r in done[3:])
    assert len(during["tokens"]) == 3 and len(after["tokens"]) == 4 and len(after["audio"]) > 0
    assert restarts == {"encoder": 1, "generator": 0, "vocoder": 1}


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_past_its_budget_a_stage_rests_then_comes_back(mode):
    async def main():
        g = graph()
        g.stage("vocoder").max_restarts = 1
        g.stage("vocoder").restart_cooldown_s = 1.5
        async with Kernel(g, mode=mode) as kernel:
            kernel.kill("vocoder")
            await _until(lambda: kernel.health()["vocoder"] == "up" and kernel.restarts_total["vocoder"] == 1)
            kernel.kill("vocoder")
            await _until(lambda: kernel.health()["vocoder"] == "down")
            degraded = kernel.degraded()
            with pytest.raises(StageDown, match="vocoder"):
                kernel.submit({"prompt": "speak"})
            served = await run_one(kernel, "text meanwhile", max_tokens=3, **TEXT)
            t0 = asyncio.get_running_loop().time()
            await _until(lambda: kernel.health()["vocoder"] == "up")
            rested = asyncio.get_running_loop().time() - t0
            spoken = await run_one(kernel, "speak again", max_tokens=3)
            return degraded, served, rested, spoken, kernel.degraded()

    degraded, served, rested, spoken, degraded_after = asyncio.run(main())
    assert degraded == ["audio_output"] and degraded_after == []
    assert len(served["tokens"]) == 3 and len(spoken["audio"]) > 0
    assert 0.5 < rested < 10


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_a_prompt_longer_than_the_context_fails_alone_before_any_work(mode):
    """30 MB of prompt (its embeddings would be 3.8 GB): refused at the encoder's open, which lives on."""
    async def main():
        async with Kernel(graph("shm", generator={"step_delay_s": 0.01}), mode=mode) as kernel:
            pid = kernel.pid_of("encoder")
            live = asyncio.ensure_future(run_one(kernel, "a small one", max_tokens=20))
            await asyncio.sleep(0.05)
            with pytest.raises(InvalidRequest, match="context"):
                await kernel.submit({"prompt": "x" * (30 << 20), "max_tokens": 2}).collect()
            return await live, pid == kernel.pid_of("encoder"), (await kernel.stats())["encoder.0"]["restarts_in_window"]

    live, same_pid, restarts = asyncio.run(main())
    assert len(live["tokens"]) == 20 and same_pid and restarts == 0
