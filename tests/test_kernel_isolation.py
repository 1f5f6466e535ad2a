"""One request never hurts another inside the kernel: an output that cannot be sent fails only its
request (the actor lives on), in both modes."""

from __future__ import annotations

import asyncio

import pytest

from kernel_helpers import graph, run_one
from omni.kernel.errors import PayloadTooLarge
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
    assert pid_after == pid and stats["encoder.0"]["restarts"] == 0 and set(health.values()) == {"up"}
    assert stats["encoder.0"]["in_flight"] == 0
