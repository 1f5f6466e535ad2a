"""Streaming code2wav: chunked decoding equals transformers' full decode, for every preset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import StageContext
from omni.layers.codec.wave_decoder import samples_for
from omni.models.qwen3_omni.modules.code2wav import Code2Wav
from omni.models.qwen3_omni.stages.code2wav_stage import Code2WavStage
from omni.models.qwen3_omni.config import Code2WavConfig
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.checkpoint.tiny_presets import PRESETS
from omni.stages.vocoder import VocoderStage

TOL = 1e-4  # of the waveform's peak
CHUNKINGS = [(1, 3), (4, 8), (10, 3), (1, 8), (4, 3), (10, 8)]


@pytest.fixture(scope="module", params=sorted(PRESETS))
def pair(request, tmp_path_factory):
    """(omni Code2Wav, transformers Code2Wav) of one tiny checkpoint."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    path = make_tiny(tmp_path_factory.mktemp(request.param), seed=1, preset=request.param)
    reference = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(path)).code2wav.eval()
    return Code2Wav.from_checkpoint(path), reference


def _codes(model: Code2Wav, batch: int, frames: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.cfg.codebook_size, (batch, model.cfg.num_quantizers, frames), generator=g)


def _reference(reference, codes: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return reference(codes)[:, 0]


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    peak = b.abs().max().item()
    assert peak > 1e-3, "degenerate waveform"
    assert (a - b).abs().max().item() <= TOL * peak


def test_full_decode_matches_transformers(pair):
    model, reference = pair
    codes = _codes(model, 2, 23, seed=0)
    ref = _reference(reference, codes)
    assert ref.shape[-1] == model.samples_for(23)
    _close(model(codes)[:, 0], ref)


@pytest.mark.parametrize("first,chunk", CHUNKINGS)
def test_streamed_equals_full_decode(pair, first, chunk):
    model, reference = pair
    frames = 29  # a multiple of no chunk size
    codes = _codes(model, 1, frames, seed=first * 31 + chunk)
    ref = _reference(reference, codes)[0]
    stream, pieces, start, n = model.new_stream(), [], 0, first
    while start < frames:
        end = min(frames, start + n)
        pieces.append(model.decode(codes[:, :, start:end], [stream])[0])
        assert stream.samples == model.samples_for(end)  # every sample emitted is final
        start, n = end, chunk
    _close(torch.cat(pieces), ref)


def test_batched_streams_equal_single(pair):
    model, _ = pair
    codes = _codes(model, 3, 20, seed=7)
    offsets = [0, 2, 9]  # streams at different positions share one forward
    alone, together = [], []
    for b, off in enumerate(offsets):
        s1, s2 = model.new_stream(), model.new_stream()
        model.decode(codes[b:b + 1, :, :off + 1], [s1])
        model.decode(codes[b:b + 1, :, :off + 1], [s2])
        alone.append((s1, b, off))
        together.append(s2)
    single = [model.decode(codes[b:b + 1, :, off + 1:off + 6], [s])[0] for s, b, off in alone]
    batch = torch.stack([codes[b, :, off + 1:off + 6] for b, off in enumerate(offsets)])
    batched = model.decode(batch, together)
    for b in range(3):
        assert (batched[b] - single[b]).abs().max().item() <= 1e-6


def test_lookahead_of_published_rates():
    cfg = Code2WavConfig(2048, 1024, 3072, 8, 16, 16, 64, 72, 1e-5, 1e4, 0.01, 16, (8, 5, 4, 3), (2, 2), 1536)
    assert cfg.total_upsample == 1920
    # what transformers' chunked_decode loses at each chunk boundary
    assert cfg.total_upsample - samples_for(cfg, 1) == 555
    assert samples_for(cfg, 50) == 50 * 1920 - 555


def test_rejects_bad_codes(pair):
    model, _ = pair
    with pytest.raises(ValueError):
        model.decode(torch.zeros(1, model.cfg.num_quantizers + 1, 3, dtype=torch.long), [model.new_stream()])
    with pytest.raises(ValueError):
        model.decode(torch.full((1, model.cfg.num_quantizers, 3), model.cfg.codebook_size), [model.new_stream()])


def _run_stage(stage: VocoderStage, feeds: dict[str, list[np.ndarray]]):
    """Feed each request piece by piece (interleaved), stepping after each round; close at the end."""
    audio = {rid: [] for rid in feeds}
    finished, first_audio_round = set(), {}
    for rid in feeds:
        stage.open(rid, {})
    rounds = max(len(p) for p in feeds.values())
    for i in range(rounds + 1):
        for rid, pieces in feeds.items():
            if i < len(pieces):
                stage.feed(rid, "codes", {"codes": pieces[i]})
            elif i == len(pieces):
                stage.close_input(rid)
        while stage.has_work():
            for e in stage.step():
                if e.data is not None:
                    assert e.port == "audio" and e.data["sample_rate"] == 24000
                    assert e.data["pcm"].dtype == np.float32 and e.data["pcm"].ndim == 1
                    audio[e.rid].append(e.data["pcm"])
                    first_audio_round.setdefault(e.rid, i)
                if e.finish:
                    finished.add(e.rid)
    return {rid: np.concatenate(a) for rid, a in audio.items()}, finished, first_audio_round


def test_vocoder_stage_streams_batches_and_flushes(pair):
    model, reference = pair
    lengths = {"a": 17, "b": 26, "c": 9}
    codes = {rid: _codes(model, 1, n, seed=len(rid) + n) for rid, n in lengths.items()}
    feeds = {rid: [c[0].T.numpy()[i:i + 2] for i in range(0, c.shape[-1], 2)] for rid, c in codes.items()}
    ctx = StageContext(name="vocoder", args={"first_chunk_frames": 4, "chunk_frames": 5, "max_batch": 8})
    stage = VocoderStage(ctx, codec=model)
    audio, finished, first_round = _run_stage(stage, feeds)
    assert finished == set(lengths) and not stage.requests
    for rid, c in codes.items():
        _close(torch.from_numpy(audio[rid]), _reference(reference, c)[0])
    assert first_round["b"] == 1  # 4 frames arrived after two feeds of 2: audio before the end
    chunks = sum(1 + -(-(n - 4) // 5) for n in lengths.values())
    assert stage.forwards < chunks  # requests at the same phase shared forwards


def test_vocoder_stage_abort_and_errors(pair):
    model, _ = pair
    stage = VocoderStage(StageContext(name="vocoder", args={"first_chunk_frames": 2}), codec=model)
    stage.open("x", {})
    stage.feed("x", "codes", {"codes": np.zeros((3, model.num_groups), dtype=np.int64)})
    assert stage.backlog() == 3 and stage.has_work()
    stage.abort("x")
    assert not stage.requests and not stage.has_work() and stage.backlog() == 0
    stage.open("y", {"vocoder_first_chunk_frames": 1})
    with pytest.raises(InvalidRequest):
        stage.feed("y", "codes", {"codes": np.zeros((3, model.num_groups + 1), dtype=np.int64)})
    with pytest.raises(InvalidRequest):
        stage.feed("y", "codes", {"codes": np.full((2, model.num_groups), model.codebook_size)})
    with pytest.raises(InvalidRequest):
        stage.open("z", {"vocoder_chunk_frames": 0})
    stage.close_input("y")
    emits = stage.step()
    assert [(e.rid, e.finish, e.data) for e in emits] == [("y", True, None)]


def test_code2wav_stage_loads_from_checkpoint(tmp_path):
    path = make_tiny(tmp_path / "ckpt", preset="tiny-a")
    stage = Code2WavStage(StageContext(name="code2wav", args={"model_dir": str(path), "first_chunk_frames": 1}))
    stage.setup()
    stage.open("r", {})
    stage.feed("r", "codes", {"codes": np.ones((1, stage.codec.num_groups), dtype=np.int64)})
    emits = stage.step()
    assert len(emits) == 1 and len(emits[0].data["pcm"]) == stage.codec.samples_for(1)
