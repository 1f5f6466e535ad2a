"""Each GPU stage reports its process's CUDA memory in its stats (omni/stages/gpu_memory.py), which
/metrics exports as `omni_stage_gpu_*_bytes` and bench/timeline.py shows per stage; off a GPU
there are no such fields."""

from __future__ import annotations

import pytest
import torch

from omni.stages.gpu_memory import gpu_memory
from omni.kernel.stage import StageContext
from omni.stages.vocoder import VocoderStage
from test_vocoder_batching import CountingCodec


class CpuCodec(CountingCodec):
    device = "cpu"


def test_no_gpu_fields_off_a_gpu():
    assert gpu_memory("cpu") == {}
    stage = VocoderStage(StageContext(name="v", args={}), codec=CpuCodec())
    stage.setup()
    assert not [k for k in stage.stats() if k.startswith("gpu_")] and stage.stats()["graphs"] == 0


@pytest.mark.gpu
def test_a_cuda_process_reports_what_it_holds():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    got = gpu_memory("cuda:0")
    assert got["gpu_allocated_bytes"] >= x.numel() and got["gpu_reserved_bytes"] >= got["gpu_allocated_bytes"]
    assert got["gpu_peak_bytes"] >= got["gpu_allocated_bytes"] and got["gpu_free_bytes"] > 0
