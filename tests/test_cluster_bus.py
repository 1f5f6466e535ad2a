"""The control bus over TCP and the network channel between stages placed on different nodes, on
one machine without Ray: a host that tells each stage process it runs on a node of its own makes
every edge between stages cross "hosts", so the payloads take the network channel, never shm."""

from __future__ import annotations

import asyncio

import pytest

from kernel_helpers import graph, run_one, shm_segments
from omni.cluster.addresses import peers
from omni.cluster.local import LocalHost
from omni.kernel.kernel import Kernel

PROMPTS = ["hello there", "a second, longer prompt for the demo graph"]


class NodePerStage(LocalHost):
    """Each stage on a "node" of its own (its name), the bus on TCP over loopback."""

    def spawn(self, config, spec):
        return super().spawn({**config, "env": {**config["env"], "OMNI_NODE": spec.name}}, spec)


async def _outputs(kernel: Kernel) -> list[dict]:
    return [await run_one(kernel, p, max_tokens=10) for p in PROMPTS]


async def _reference() -> list[dict]:
    async with Kernel(graph("shm"), mode="process") as kernel:
        return await _outputs(kernel)


def _same(got: list[dict], want: list[dict]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g["tokens"] == w["tokens"] and g["text"] == w["text"] and len(w["audio"]) > 0
        assert (g["audio"] == w["audio"]).all()


def test_the_bus_runs_over_tcp_with_the_same_outputs():
    async def main():
        want = await _reference()
        async with Kernel(graph("shm"), mode="process", host=LocalHost("127.0.0.1")) as kernel:
            book = peers(kernel.run_dir)
            assert sorted(book) == ["encoder.0", "generator.0", "vocoder.0"]
            assert all(address.startswith("tcp://127.0.0.1:") for address, _ in book.values())
            assert kernel.mailbox.address.startswith("tcp://127.0.0.1:")
            _same(await _outputs(kernel), want)
            assert shm_segments(kernel.instance)  # one node: the edges forced to shm use shm

    asyncio.run(main())


def test_stages_on_different_nodes_talk_through_the_network_channel():
    async def main():
        want = await _reference()
        async with Kernel(graph("shm"), mode="process", host=NodePerStage("127.0.0.1")) as kernel:
            assert {node for _, node in peers(kernel.run_dir).values()} == {"encoder", "generator", "vocoder"}
            _same(await _outputs(kernel), want)
            assert not shm_segments(kernel.instance)  # shm cannot cross hosts: the network channel took them

    asyncio.run(main())


def test_a_replica_restarted_on_tcp_gets_a_new_address_and_serves():
    async def main():
        async with Kernel(graph(), mode="process", host=NodePerStage("127.0.0.1")) as kernel:
            before = await run_one(kernel, PROMPTS[0], max_tokens=10)
            old = peers(kernel.run_dir)["vocoder.0"]
            kernel.kill("vocoder")
            for _ in range(200):
                await asyncio.sleep(0.05)
                if kernel.health()["vocoder"] == "up" and peers(kernel.run_dir)["vocoder.0"] != old:
                    break
            assert kernel.restarts_total["vocoder"] == 1 and peers(kernel.run_dir)["vocoder.0"] != old
            after = await run_one(kernel, PROMPTS[0], max_tokens=10)
            assert after["tokens"] == before["tokens"] and (after["audio"] == before["audio"]).all()

    asyncio.run(main())
