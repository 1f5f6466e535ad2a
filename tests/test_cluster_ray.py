"""The tiny Qwen3-Omni graph on a two-node Ray cluster on this machine (a head, and a second node
with its own custom resource): thinker and its inputs on the head, talker and code2wav on the other
node. Split, it gives exactly the single-process output (greedy tokens and codec codes), with the
thinker -> talker edge forced to shm running over the network channel; when the second node is
removed, the requests it held fail within seconds with a clear error, the two replicas come back
on the head (where shm works again), and new requests are served as before."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from omni.cluster.addresses import peers  # noqa: E402
from omni.cluster.ray_host import RayHost  # noqa: E402
from omni.kernel.errors import StageFailed  # noqa: E402
from omni.kernel.kernel import Kernel  # noqa: E402
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny  # noqa: E402
from omni.models.qwen3_omni.graph import build  # noqa: E402
from qwen3_fixtures import THREADS_ENV, LoopThread, expose_codes, params, prompts, summarize  # noqa: E402

SPEECH = ("talker", "code2wav")
FORCED_SHM = (("thinker", "talker"), ("talker", "code2wav"))


def split_graph(ckpt: str):
    graph, _ = build(ckpt)
    graph = expose_codes(graph)
    for spec in graph.stages:
        spec.resources = {"prefer:node_b": 1} if spec.name in SPEECH else {"prefer:node_a": 1}
        spec.restart_window_s, spec.start_timeout_s = 60.0, 150.0  # starts slow beside a second test worker
    for edge in graph.edges:
        if (edge.src, edge.dst) in FORCED_SHM:
            edge.channel = "shm"  # one host: shm; across nodes it must become the network channel
    return graph


def shm_of(instance: str, stage: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"omni-{instance}-{stage}-")]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    ckpt = str(make_tiny(tmp_path_factory.mktemp("ray"), seed=0, preset="tiny-a"))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1}})
    node_b = cluster.add_node(num_cpus=1, resources={"node_b": 1})
    cluster.wait_for_nodes()
    loop = LoopThread()
    try:
        yield ckpt, cluster, node_b, loop
    finally:
        loop.close()
        ray.shutdown()
        cluster.shutdown()


def request(thinker: int = 10, talker: int = 24) -> dict:
    return params(prompts()["text"], "ethan", thinker, talker)


async def run(kernel: Kernel, p: dict):
    return summarize(await kernel.submit(p).collect())


def same(got, want) -> None:
    assert got.tokens == want.tokens and len(want.tokens) > 0
    assert got.codes is not None and np.array_equal(got.codes, want.codes)
    assert np.array_equal(got.pcm, want.pcm)


def test_split_across_two_nodes_equals_one_process_and_survives_losing_a_node(setup):
    ckpt, cluster, node_b, loop = setup

    async def reference():
        async with Kernel(split_graph(ckpt), mode="inline", env=dict(THREADS_ENV)) as kernel:
            return await run(kernel, request()), await run(kernel, request(10, 400))

    want, long_want = loop.run(reference(), timeout=180)

    async def main():
        host = RayHost(cluster.address)
        kernel = Kernel(split_graph(ckpt), host=host, env=dict(THREADS_ENV), heartbeat_timeout_s=10.0)
        await kernel.start()
        try:
            nodes = {name: node for name, (_, node) in peers(kernel.run_dir).items()}
            assert nodes["talker.0"] == nodes["code2wav.0"] == node_b.node_id
            assert nodes["thinker.0"] != node_b.node_id
            same(await run(kernel, request()), want)
            assert not shm_of(kernel.instance, "thinker")  # its edge to the talker crossed nodes: network
            assert shm_of(kernel.instance, "talker")  # talker -> code2wav, both on node b: shm

            stream = kernel.submit(request(10, 400))  # long enough to be in flight on node b
            first = await stream.__anext__()
            while first.port != "codes":
                first = await stream.__anext__()
            t0 = time.monotonic()
            cluster.remove_node(node_b)
            with pytest.raises(StageFailed, match="talker|code2wav"):
                async for _ in stream:
                    pass
            failed_s = time.monotonic() - t0
            assert failed_s < 10.0, failed_s

            deadline = time.monotonic() + 150
            while not all(kernel.health()[s] == "up" for s in SPEECH):
                assert time.monotonic() < deadline, kernel.health()
                await asyncio.sleep(0.1)
            nodes = {name: node for name, (_, node) in peers(kernel.run_dir).items()}
            assert nodes["talker.0"] == nodes["code2wav.0"] == nodes["thinker.0"]  # back on the head
            same(await run(kernel, request()), want)
            same(await run(kernel, request(10, 400)), long_want)
            assert shm_of(kernel.instance, "thinker")  # one node again: the forced shm edge is shm
            return failed_s
        finally:
            await kernel.stop()

    failed_s = loop.run(main(), timeout=420)
    print(f"in-flight request failed {failed_s:.2f} s after the node was removed")


def test_an_unreachable_or_malformed_cluster_address_is_a_clear_error_at_once():
    from omni.cluster.ray_host import parse_cluster

    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match="cannot reach the Ray cluster at 127.0.0.1:1"):
        RayHost(parse_cluster("ray:127.0.0.1:1"))
    assert time.monotonic() - t0 < 10
    with pytest.raises(ValueError, match="--cluster takes"):
        parse_cluster("redis://x")
