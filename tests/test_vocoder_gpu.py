"""The vocoder stage's batching and device handling, on CPU and (marked `gpu`) on CUDA.

CPU: requests at different stream offsets decoded in one forward equal each decoded alone;
first and later chunks due together are both decoded in that step (first chunks first);
tensor codes on the codec's device stay tensors, one bad request fails alone; max_batch
defaults by device. GPU: code2wav on CUDA fed CUDA codes, batched == per request, and close
to the CPU decode.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from omni.kernel.stage import StageContext
from omni.models.qwen3_omni.modules.code2wav import Code2Wav
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.stages.vocoder import CPU_MAX_BATCH, GPU_MAX_BATCH, VocoderStage

pytest.importorskip("transformers")

FIRST, CHUNK = 4, 6


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny-b"), seed=1, preset="tiny-b")


@pytest.fixture(scope="module")
def model(ckpt):
    return Code2Wav.from_checkpoint(ckpt)


def _codes(model, frames: int, seed: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    return g.integers(0, model.codebook_size, (frames, model.num_groups), dtype=np.int64)


def _stage(model, **args) -> VocoderStage:
    return VocoderStage(StageContext(name="vocoder", args={"first_chunk_frames": FIRST, "chunk_frames": CHUNK, **args}),
                        codec=model)


def _drain(stage: VocoderStage, audio: dict, errors: dict | None = None) -> int:
    """Step until idle; returns the forwards it took."""
    before = stage.forwards
    while stage.has_work():
        for e in stage.step():
            if e.error is not None and errors is not None:
                errors[e.rid] = e.error
            if e.data is not None:
                audio.setdefault(e.rid, []).append(e.data["pcm"])
    return stage.forwards - before


def _decode(stage: VocoderStage, rid: str, pieces: list, audio: dict) -> None:
    for piece in pieces:
        stage.feed(rid, "codes", {"codes": piece})
        _drain(stage, audio)


# offsets: frames each request has decoded before the three share a forward
OFFSETS = {"a": 4, "b": 16, "c": 10}


def _phases(model, as_tensor=lambda x: x):
    """Per request: its warm-up feeds (to reach its offset), one shared chunk, and a tail."""
    out = {}
    for i, (rid, off) in enumerate(OFFSETS.items()):
        codes = _codes(model, off + CHUNK + 5, seed=i)
        warm = [codes[:FIRST]] + [codes[s:s + CHUNK] for s in range(FIRST, off, CHUNK)]
        out[rid] = ([as_tensor(w) for w in warm], as_tensor(codes[off:off + CHUNK]), as_tensor(codes[off + CHUNK:]))
    return out


def _alone(model, phases) -> dict:
    audio = {}
    for rid, (warm, shared, tail) in phases.items():
        stage = _stage(model)
        stage.open(rid, {})
        _decode(stage, rid, warm + [shared, tail], audio)
        stage.close_input(rid)
        _drain(stage, audio)
    return {rid: np.concatenate(a) for rid, a in audio.items()}


def _together(model, phases, check=None, errors: dict | None = None) -> tuple[dict, int]:
    stage, audio = _stage(model), {}
    for rid, (warm, _, _) in phases.items():
        stage.open(rid, {})
        _decode(stage, rid, warm, audio)
    for rid, (_, shared, _) in phases.items():
        stage.feed(rid, "codes", {"codes": shared})
    if check is not None:
        check(stage)
    shared_forwards = _drain(stage, audio, errors)
    for rid, (_, _, tail) in phases.items():
        if rid in stage.requests:
            stage.feed(rid, "codes", {"codes": tail})
            stage.close_input(rid)
    _drain(stage, audio, errors)
    assert not stage.requests
    return {rid: np.concatenate(a) for rid, a in audio.items()}, shared_forwards


def test_requests_at_different_offsets_decode_together_as_alone(model):
    phases = _phases(model)
    alone = _alone(model, phases)
    together, forwards = _together(model, phases)
    assert forwards == 1  # the three shared one forward
    for rid in OFFSETS:
        peak = float(np.abs(alone[rid]).max())
        assert peak > 1e-3 and together[rid].shape == alone[rid].shape
        assert float(np.abs(together[rid] - alone[rid]).max()) <= 1e-5 * peak


def test_first_and_later_chunks_due_together_run_in_one_step(model):
    stage, audio = _stage(model), {}
    stage.open("old", {})
    _decode(stage, "old", [_codes(model, FIRST, seed=1)], audio)
    stage.open("new", {})
    stage.feed("old", "codes", {"codes": _codes(model, CHUNK, seed=2)})
    stage.feed("new", "codes", {"codes": _codes(model, FIRST, seed=3)})
    emits = stage.step()
    assert stage.forwards == 3 and not stage.has_work()  # 1 before, then both shapes in one step
    assert [e.rid for e in emits] == ["new", "old"]  # the first chunk (time to first audio) first


def test_tensor_codes_stay_tensors_and_bad_rows_fail_alone(model):
    phases = _phases(model, as_tensor=torch.from_numpy)
    want = _alone(model, _phases(model))
    bad = phases["b"][1].clone()
    bad[2, 1] = model.codebook_size
    phases["b"] = (phases["b"][0], bad, phases["b"][2])

    def check(stage):
        assert all(isinstance(p, torch.Tensor) for r in stage.requests.values() for p in r.pending)

    stage_errors = {}
    got, forwards = _together(model, phases, check, stage_errors)
    assert forwards == 1 and list(stage_errors) == ["b"] and "codes must lie in" in stage_errors["b"]
    for rid in ("a", "c"):
        assert float(np.abs(got[rid] - want[rid]).max()) <= 1e-5 * float(np.abs(want[rid]).max())


def test_max_batch_defaults_by_device(model):
    assert _stage(model).max_batch == CPU_MAX_BATCH
    gpu_codec = SimpleNamespace(device="cuda:0", sample_rate=24000, num_groups=4, codebook_size=8)
    assert _stage(gpu_codec).max_batch == GPU_MAX_BATCH == 128
    assert _stage(gpu_codec, max_batch=3).max_batch == 3


def test_float_codes_are_rejected(model):
    from omni.kernel.errors import InvalidRequest

    stage = _stage(model)
    stage.open("r", {})
    with pytest.raises(InvalidRequest):
        stage.feed("r", "codes", {"codes": np.zeros((2, model.num_groups), dtype=np.float32)})
    with pytest.raises(InvalidRequest):
        stage.feed("r", "codes", {"codes": torch.zeros(2, model.num_groups)})


# ---- on the GPU ----------------------------------------------------------------------------

@pytest.mark.gpu
def test_code2wav_on_cuda_batched_equals_alone(ckpt, model, exact_cuda):
    cuda = Code2Wav.from_checkpoint(ckpt, device="cuda")
    to_cuda = lambda x: torch.from_numpy(x).cuda()  # noqa: E731

    def on_device(stage):
        assert all(p.is_cuda for r in stage.requests.values() for p in r.pending)

    together, forwards = _together(cuda, _phases(cuda, to_cuda), on_device)
    alone = _alone(cuda, _phases(cuda, to_cuda))
    cpu = _alone(model, _phases(model))
    assert forwards == 1
    for rid in OFFSETS:
        peak = float(np.abs(cpu[rid]).max())
        assert together[rid].dtype == np.float32 and together[rid].shape == alone[rid].shape
        assert float(np.abs(together[rid] - alone[rid]).max()) <= 1e-5 * peak
        assert float(np.abs(together[rid] - cpu[rid]).max()) <= 1e-4 * peak
