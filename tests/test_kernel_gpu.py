"""cuda_ipc through the kernel: hidden states move between two GPU stage processes without copies."""

from __future__ import annotations

import asyncio

import pytest

from omni.kernel.graph import OUT, EdgeSpec, Graph, StageSpec
from omni.kernel.kernel import Kernel

pytestmark = pytest.mark.gpu


def _graph() -> Graph:
    return Graph("cuda-pair", [
        StageSpec("producer", "tests.gpu_stages.cuda_pair:CudaProducer", device="cuda:0", arena_bytes=16 << 20),
        StageSpec("consumer", "tests.gpu_stages.cuda_pair:CudaConsumer", device="cuda:0"),
    ], [EdgeSpec("producer", "hidden", "consumer"), EdgeSpec("consumer", "report", OUT)])


def test_cuda_ipc_between_stage_processes_is_zero_copy():
    async def main():
        async with Kernel(_graph(), mode="process") as kernel:
            events = await asyncio.gather(*(kernel.submit({}).collect() for _ in range(4)))
        return events

    results = asyncio.run(main())
    for events in results:
        rows = [e for e in events if e.port == "report"][0].data["rows"]
        assert len(rows) == 8
        assert all(r["is_cuda"] and r["equal"] and r["in_pool"] for r in rows), rows
