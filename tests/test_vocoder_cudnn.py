"""The vocoder stage turns cuDNN's per-shape algorithm search on for a codec on a GPU (the default
heuristic picked a non-tensor-core conv at 1.2-2.4 ms a call on an H200), and only there."""

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


def test_cudnn_search_is_on_for_a_codec_on_a_gpu(monkeypatch):
    assert _setup("cuda:0", monkeypatch) is True


def test_cudnn_search_stays_off_on_the_cpu_and_when_turned_off(monkeypatch):
    assert _setup("cpu", monkeypatch) is False
    assert _setup("cuda:0", monkeypatch, cudnn_benchmark=False) is False
