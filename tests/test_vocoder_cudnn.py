"""The vocoder stage's `cudnn_benchmark` arg turns cuDNN's per-shape algorithm search on for a codec on
a GPU (its heuristic picks a non-tensor-core conv at 1.2-2.4 ms a call for some shapes on an H200),
and only there; off by default (the search added ~55 s to a start-up)."""

from __future__ import annotations

import torch

from omni.kernel.stage import StageContext
from omni.stages.vocoder import VocoderStage


class _Codec:
    def __init__(self, device: str) -> None:
        self.device = device


def _setup(device: str, monkeypatch, **args) -> bool:
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    stage = VocoderStage(StageContext("codec", args=args), codec=_Codec(device))
    stage.setup()
    return torch.backends.cudnn.benchmark


def test_cudnn_search_is_on_for_a_codec_on_a_gpu_when_asked(monkeypatch):
    assert _setup("cuda:0", monkeypatch, cudnn_benchmark=True) is True


def test_cudnn_search_stays_off_by_default_and_on_the_cpu(monkeypatch):
    assert _setup("cuda:0", monkeypatch) is False
    assert _setup("cpu", monkeypatch, cudnn_benchmark=True) is False
