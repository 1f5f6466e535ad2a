"""The tiny Qwen3-Omni graph's time to first audio on one node (stage processes here) vs split over
a two-node Ray cluster on this machine (thinker on the head, talker + code2wav on node b, the
thinker -> talker edge over the network channel). Median of `--n` requests after one warm-up.

    python bench/ttfa_split.py [--n 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from omni.cluster.ray_host import RayHost  # noqa: E402
from omni.kernel.kernel import Kernel  # noqa: E402
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny  # noqa: E402
from qwen3_fixtures import THREADS_ENV  # noqa: E402
from test_cluster_ray import request, split_graph  # noqa: E402


async def ttfa(kernel: Kernel, n: int) -> float:
    times = []
    for i in range(n + 1):
        t0 = time.perf_counter()
        async for event in kernel.submit(request(10, 24)):
            if event.port == "audio":
                times.append(time.perf_counter() - t0)
                break
        await asyncio.sleep(0.5)  # the rest of the answer drains
    return statistics.median(times[1:]) * 1e3


async def main(n: int) -> None:
    ckpt = str(make_tiny(Path(tempfile.mkdtemp()), seed=0, preset="tiny-a"))
    async with Kernel(split_graph(ckpt), env=dict(THREADS_ENV)) as kernel:
        single = await ttfa(kernel, n)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1}})
    cluster.add_node(num_cpus=1, resources={"node_b": 1})
    cluster.wait_for_nodes()
    try:
        async with Kernel(split_graph(ckpt), host=RayHost(cluster.address), env=dict(THREADS_ENV)) as kernel:
            split = await ttfa(kernel, n)
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"TTFA median of {n}: one node {single:.0f} ms, split over two Ray nodes {split:.0f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=5)
    asyncio.run(main(parser.parse_args().n))
