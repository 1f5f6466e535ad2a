"""Qwen3-TTS's audio side against the reference (`qwen_tts`): the 12 Hz speech tokenizer's decoder
(whole, streamed in chunks, after a cloned voice's reference codes, batched in the codec stage),
its Mimi encoder (codes exactly equal) and the speaker encoder (x-vectors within a tight tolerance),
on two tiny random tokenizers written by omni's `tiny_tokenizer` and loaded by both.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import qwen3_tts_reference
from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import StageContext
from omni.models.qwen3_tts.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_tts.checkpoint.presets import PRESETS as MODEL_PRESETS
from omni.models.qwen3_tts.checkpoint.tiny_tokenizer import tokenizer_config, write_tiny_tokenizer
from omni.models.qwen3_tts.modules.speaker_encoder import SpeakerEncoder
from omni.models.qwen3_tts.modules.speech_tokenizer import parse_tokenizer_config
from omni.models.qwen3_tts.modules.speech_tokenizer_decoder import SpeechTokenizerDecoder
from omni.models.qwen3_tts.modules.speech_tokenizer_encoder import SpeechTokenizerEncoder
from omni.models.qwen3_tts.stages.codec_stage import CodecStage
from omni.models.weights import CheckpointError

REF = qwen3_tts_reference.load()
pytestmark = pytest.mark.skipif(REF is None, reason="the Qwen3-TTS reference (qwen-tts-hf, librosa, einops) is not installed")
PRESETS = ("tiny-a", "tiny-b")
ATOL = 1e-4  # PCM in [-1, 1]; observed differences are ~3e-5 (float32 reduction order)


def _sizes(preset: str) -> tuple[int, int]:
    p = MODEL_PRESETS[preset]
    return p.num_code_groups, p.codebook_size


@pytest.fixture(scope="module", params=PRESETS)
def tok(request, tmp_path_factory):
    """(preset, folder, omni decoder, omni encoder, the reference's Qwen3TTSTokenizer)."""
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer

    groups, size = _sizes(request.param)
    path = tmp_path_factory.mktemp(f"tok-{request.param}")
    write_tiny_tokenizer(path, num_quantizers=groups, codebook_size=size, preset=request.param, seed=3)
    return (request.param, path, SpeechTokenizerDecoder.from_dir(path), SpeechTokenizerEncoder.from_dir(path),
            Qwen3TTSTokenizer.from_pretrained(str(path)))


def _codes(dec: SpeechTokenizerDecoder, batch: int, frames: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, dec.codebook_size, (batch, frames, dec.num_groups), generator=gen)


def _clip(seconds: float, seed: int, rate: int = 24000) -> np.ndarray:
    """Noise shaped like speech enough for the encoders: bursts of tones at varying pitch."""
    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * rate)) / rate
    pcm = 0.3 * np.sin(2 * np.pi * (150 + 80 * np.sin(3 * t)) * t) * (0.5 + 0.5 * np.sin(7 * t))
    return (pcm + 0.02 * rng.standard_normal(len(t))).astype(np.float32)


def test_tokenizer_loads_every_weight_in_the_reference(tok):
    _, path, dec, enc, ref = tok
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        written = {k: f.get_tensor(k) for k in f.keys()}
    loaded = ref.model.state_dict()
    assert len(loaded) >= len(written) * 0.9
    split = any(k.startswith("encoder.encoder.encoder_seanet.") for k in loaded)  # transformers >= 5.24's Mimi
    renamed = written if not split else {k.replace("encoder.encoder.layers.", "encoder.encoder.encoder_seanet.layers.")
                .replace("encoder.encoder_transformer.", "encoder.encoder.encoder_transformer.")
                .replace("encoder.downsample.", "encoder.encoder.downsample."): v for k, v in written.items()}
    for name, tensor in renamed.items():
        assert name in loaded, name
        assert torch.equal(loaded[name].float(), tensor.float()), name


@pytest.mark.parametrize("frames", [(13, 13), (17, 6), (1, 1)])
def test_decode_equals_the_reference(tok, frames):
    _, _, dec, _, ref = tok
    codes = _codes(dec, 2, max(frames), seed=sum(frames))
    want, rate = ref.decode([{"audio_codes": codes[i, :n]} for i, n in enumerate(frames)])
    assert rate == dec.sample_rate == 24000
    for i, n in enumerate(frames):
        got = dec.decode_frames(codes[i:i + 1, :n], [dec.new_stream()])[0].numpy()
        assert got.shape == want[i].shape == (n * 1920,)
        np.testing.assert_allclose(got, want[i], atol=ATOL, rtol=0)
        assert float(np.abs(got).max()) > 0.05 and float(np.abs(got).mean()) < 0.6  # a waveform: not silent, not clipped


@pytest.mark.parametrize("chunks", [[1, 2, 4, 7, 3], [4, 12, 1], [17]])
def test_streamed_decode_equals_the_whole_and_the_reference(tok, chunks):
    _, _, dec, _, ref = tok
    frames = sum(chunks)
    codes = _codes(dec, 3, frames, seed=len(chunks))
    whole = dec.decode_frames(codes, [dec.new_stream() for _ in range(3)]).numpy()
    streams = [dec.new_stream() for _ in range(3)]
    parts, start = [], 0
    for n in chunks:
        part = dec.decode_frames(codes[:, start:start + n], streams).numpy()
        assert part.shape == (3, n * 1920)  # every sample is final as soon as its frame arrives
        parts.append(part)
        start += n
    streamed = np.concatenate(parts, axis=1)
    np.testing.assert_allclose(streamed, whole, atol=ATOL, rtol=0)
    want, _ = ref.decode([{"audio_codes": c} for c in codes])
    for i in range(3):
        np.testing.assert_allclose(streamed[i], want[i], atol=ATOL, rtol=0)


def _run_codec(stage: CodecStage, feeds: dict[str, list[dict]], params: dict | None = None) -> dict[str, np.ndarray]:
    out: dict[str, list[np.ndarray]] = {rid: [] for rid in feeds}
    for rid, items in feeds.items():
        stage.open(rid, params or {})
        for item in items:
            stage.feed(rid, "codes", item)
        stage.close_input(rid)
    done: set[str] = set()
    while len(done) < len(feeds):
        assert stage.has_work()
        for e in stage.step():
            assert e.error is None, e.error
            if e.data:
                out[e.rid].append(e.data["pcm"])
            if e.finish:
                done.add(e.rid)
    return {rid: np.concatenate(p) if p else np.zeros(0, np.float32) for rid, p in out.items()}


def test_codec_stage_after_reference_codes_is_the_references_cut(tok):
    """The reference decodes ref_codes + codes and drops the first T / (T + N) of the waveform."""
    _, _, dec, _, ref = tok
    both = _codes(dec, 1, 19, seed=7)[0]
    ref_codes, codes = both[:11], both[11:]
    wav = ref.decode([{"audio_codes": both}])[0][0]
    want = wav[int(len(ref_codes) / len(both) * len(wav)):]
    stage = CodecStage(StageContext("codec", args={"first_chunk_frames": 2, "chunk_frames": 3}), codec=dec)
    feeds = {"a": [{"ref_codes": ref_codes.numpy()}] + [{"codes": codes[i:i + 1].numpy()} for i in range(len(codes))]}
    got = _run_codec(stage, feeds)["a"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    again = _run_codec(stage, {"b": feeds["a"]})["b"]  # the voice's decoder state is reused: the same audio
    assert stage.voice_state_hits == 1
    np.testing.assert_allclose(again, got, atol=1e-6, rtol=0)


def test_codec_stage_batches_requests_into_what_each_gives_alone(tok):
    _, _, dec, _, _ = tok
    codes = _codes(dec, 4, 9, seed=11)
    ref_codes = _codes(dec, 1, 5, seed=12)[0].numpy()
    feeds = {f"r{i}": ([{"ref_codes": ref_codes}] if i % 2 else []) +
             [{"codes": codes[i, j:j + 3].numpy()} for j in range(0, 9, 3)] for i in range(4)}
    alone = {rid: _run_codec(CodecStage(StageContext("codec", args={"first_chunk_frames": 2}), codec=dec),
                             {rid: f})[rid] for rid, f in feeds.items()}
    stage = CodecStage(StageContext("codec", args={"first_chunk_frames": 2}), codec=dec)
    together = _run_codec(stage, feeds)
    assert stage.forwards < 4 * 3  # requests shared forwards
    for rid in feeds:
        np.testing.assert_allclose(together[rid], alone[rid], atol=ATOL, rtol=0)


def test_codec_stage_refuses_reference_codes_after_codes(tok):
    _, _, dec, _, _ = tok
    stage = CodecStage(StageContext("codec"), codec=dec)
    stage.open("r", {})
    stage.feed("r", "codes", {"codes": np.zeros((1, dec.num_groups), np.int64)})
    with pytest.raises(InvalidRequest, match="before"):
        stage.feed("r", "codes", {"ref_codes": np.zeros((2, dec.num_groups), np.int64)})
    with pytest.raises(InvalidRequest, match="lie in"):
        stage.open("s", {})
        stage.feed("s", "codes", {"ref_codes": np.full((2, dec.num_groups), dec.codebook_size, np.int64)})


@pytest.mark.parametrize("samples", [1920 * 3, 24000 + 777, 1000, 24000 * 4 + 1])
def test_encode_equals_the_reference(tok, samples):
    _, _, _, enc, ref = tok
    pcm = _clip(samples / 24000, seed=samples)
    want = ref.encode(pcm, sr=24000).audio_codes[0].numpy()
    got = enc.encode(pcm)
    assert got.shape == want.shape == (-(-samples // 1920), enc.num_quantizers)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) >= min(got.size, 4)  # the codebooks are really searched


def test_encode_of_a_resampled_clip_equals_the_reference(tok):
    """Clips at other rates are resampled by omni's media path (soxr HQ), as librosa does for the reference."""
    from omni.api.media import resample

    _, _, _, enc, ref = tok
    pcm = _clip(1.7, seed=5, rate=16000)
    want = ref.encode(pcm, sr=16000).audio_codes[0].numpy()
    np.testing.assert_array_equal(enc.encode(resample(pcm, 16000, 24000)), want)


@pytest.fixture(scope="module", params=PRESETS)
def base_ckpt(request, tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp(f"base-{request.param}"), kind="base", preset=request.param, seed=1)


def test_speaker_embedding_equals_the_reference(base_ckpt):
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSSpeakerEncoder, mel_spectrogram
    from safetensors.torch import load_file

    raw = json.loads((base_ckpt / "config.json").read_text())["speaker_encoder_config"]
    ref = Qwen3TTSSpeakerEncoder(Qwen3TTSSpeakerEncoderConfig(**raw)).eval()
    weights = {k[len("speaker_encoder."):]: v for k, v in load_file(base_ckpt / "model.safetensors").items()
               if k.startswith("speaker_encoder.")}
    ref.load_state_dict(weights, strict=True)
    ours = SpeakerEncoder.from_checkpoint(base_ckpt)
    for seconds, seed in ((1.3, 0), (3.05, 1)):
        pcm = _clip(seconds, seed)
        mels = mel_spectrogram(torch.from_numpy(pcm)[None], n_fft=1024, num_mels=128, sampling_rate=24000,
                               hop_size=256, win_size=1024, fmin=0, fmax=12000).transpose(1, 2)
        with torch.inference_mode():
            want = ref(mels)[0].numpy()
        got = ours.embed(pcm)
        assert got.shape == (raw["enc_dim"],)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_tokenizer_config_is_checked():
    cfg = tokenizer_config("tiny-a", 4, 64)
    parse_tokenizer_config(cfg)
    with pytest.raises(CheckpointError, match="encoder_valid_num_quantizers"):
        parse_tokenizer_config({**cfg, "encoder_valid_num_quantizers": 3})
    with pytest.raises(CheckpointError, match="hop"):
        parse_tokenizer_config({**cfg, "decoder_config": {**cfg["decoder_config"], "upsampling_ratios": [2]}})
    with pytest.raises(CheckpointError, match="model_type"):
        parse_tokenizer_config({**cfg, "model_type": "qwen3_tts_tokenizer_25hz"})


def test_a_config_only_tokenizer_draws_random_weights(tmp_path):
    """What a full-size benchmark preset gets: no safetensors, weights drawn at load, one per seed."""
    write_tiny_tokenizer(tmp_path, num_quantizers=4, codebook_size=64, preset="tiny-a", seed=0)
    (tmp_path / "model.safetensors").unlink()
    a, b = SpeechTokenizerDecoder.from_dir(tmp_path, seed=2), SpeechTokenizerDecoder.from_dir(tmp_path, seed=2)
    codes = _codes(a, 1, 3, seed=0)
    np.testing.assert_array_equal(a.decode_frames(codes, [a.new_stream()]), b.decode_frames(codes, [b.new_stream()]))
    enc = SpeechTokenizerEncoder.from_dir(tmp_path, seed=2)
    assert enc.encode(_clip(0.5, 0)).shape == (7, 4)


# ---- on the GPU (the lead's H200 run; skipped without CUDA) ----------------------------------

@pytest.mark.gpu
def test_tokenizer_on_cuda_equals_the_cpu(tok, exact_cuda):
    """The codec stage's decoder in float32 and bfloat16, and the voice stage's encoder (float32,
    no TF32), on the GPU against the CPU."""
    _, path, dec, enc, _ = tok
    codes = _codes(dec, 3, 15, seed=4)
    cpu = dec.decode_frames(codes, [dec.new_stream() for _ in range(3)]).numpy()
    for dtype in (torch.float32, torch.bfloat16):
        cuda = SpeechTokenizerDecoder.from_dir(path, dtype=dtype, device="cuda")
        streams = [cuda.new_stream() for _ in range(3)]
        got = torch.cat([cuda.decode_frames(codes[:, i:i + 5].cuda(), streams) for i in (0, 5, 10)], 1)
        assert got.dtype == torch.float32 and got.shape == (3, 15 * 1920)
        got = got.cpu().numpy()
        if dtype == torch.float32:
            assert float(np.abs(got - cpu).max()) <= ATOL
        else:  # bf16 rounds every layer: the same waveform, not the same samples
            assert float(np.corrcoef(got.ravel(), cpu.ravel())[0, 1]) > 0.98
    cuda_enc = SpeechTokenizerEncoder.from_dir(path, device="cuda")
    for seconds in (1.3, 4.0):
        pcm = _clip(seconds, seed=int(seconds * 10))
        np.testing.assert_array_equal(cuda_enc.encode(pcm), enc.encode(pcm))
