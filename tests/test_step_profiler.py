"""$OMNI_PROFILE_DIR: a serving stage profiles a window of its steps and writes the kernel table
and a trace (omni/stages/step_profiler.py); off by default, and a stage not named is not profiled."""

from __future__ import annotations

import gzip
import json

import numpy as np
import torch

from omni.kernel.stage import StageContext
from omni.stages.vocoder import VocoderStage
from test_vocoder_batching import CountingCodec


class TorchCodec(CountingCodec):
    def decode_frames(self, codes, streams):
        return torch.as_tensor(super().decode_frames(codes, streams)) * 1.0  # a torch op to see


def _steps(stage: VocoderStage, n: int) -> None:
    stage.open("r", {})
    for _ in range(n):
        stage.feed("r", "codes", {"codes": np.ones((1, 2), np.int64)})
        stage.step()


def test_a_window_of_steps_is_profiled_and_written(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_PROFILE_DIR", str(tmp_path))
    monkeypatch.setenv("OMNI_PROFILE_STAGES", "codec")
    monkeypatch.setenv("OMNI_PROFILE_SKIP", "2,6")
    monkeypatch.setenv("OMNI_PROFILE_STEPS", "3")
    args = {"first_chunk_frames": 1, "chunk_frames": 1}
    named = VocoderStage(StageContext(name="codec", args=dict(args)), codec=TorchCodec())
    other = VocoderStage(StageContext(name="code2wav", args=dict(args)), codec=CountingCodec())
    _steps(named, 4)
    assert not (tmp_path / "codec.0.2.txt").exists()  # 2 skipped, 2 of 3 profiled
    _steps(named, 1)
    _steps(other, 6)
    text = (tmp_path / "codec.0.2.txt").read_text()
    assert text.startswith("codec.0: 3 steps after 2") and "aten::mul" in text
    assert json.loads(gzip.open(tmp_path / "codec.0.2.json.gz").read())["traceEvents"]
    assert not list(tmp_path.glob("code2wav*"))
    _steps(named, 4)  # the second window: steps 7-9
    assert (tmp_path / "codec.0.6.txt").read_text().startswith("codec.0: 3 steps after 6")
    assert not named.profiler.on


def test_off_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("OMNI_PROFILE_DIR", raising=False)
    stage = VocoderStage(StageContext(name="codec", args={"first_chunk_frames": 1, "chunk_frames": 1}),
                         codec=CountingCodec())
    assert not stage.profiler.on
