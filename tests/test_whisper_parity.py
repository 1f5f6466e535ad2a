"""Greedy tokens of omni's Whisper (encoder stage + decoder on the AR engine) equal transformers'
`WhisperForConditionalGeneration.generate`: a tiny random multilingual checkpoint (language given and
detected, with and without timestamps, including transformers' seek after an unfinished segment)
and the real tiny.en weights on espeak-ng speech."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_whisper_support import (
    SENTENCES,
    audio_params,
    converted_tiny_en,
    make_stages,
    run_stages,
    speak,
    tiny_random_checkpoint,
)

from omni.models.whisper.modules.features import log_mel, pad_window

MAX_NEW = 40


@pytest.fixture(scope="module")
def random_dir(tmp_path_factory):
    return tiny_random_checkpoint(tmp_path_factory.mktemp("whisper-random") / "whisper-random")


def hf_generate(model_dir, pcm: np.ndarray, **kwargs) -> list[int]:
    from transformers import WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    mel = log_mel(pad_window(pcm), model.config.num_mel_bins)[None]
    with torch.inference_mode():
        return model.generate(mel, max_new_tokens=MAX_NEW, **kwargs)[0].tolist()


def noise_clips(n: int, seconds: float = 3.0) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [(0.1 * rng.standard_normal(int(seconds * 16000))).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("timestamps", [False, True])
def test_random_checkpoint_tokens_equal_transformers(random_dir, timestamps):
    clips = noise_clips(3)
    enc, dec = make_stages(random_dir)
    requests = {f"r{i}": audio_params(pcm, language="en", timestamps=timestamps,
                                      sampling={"decoder": {"max_tokens": MAX_NEW}}) for i, pcm in enumerate(clips)}
    got = run_stages(enc, dec, requests)  # all three decode in one batch
    for i, pcm in enumerate(clips):
        want = hf_generate(random_dir, pcm, language="en", task="transcribe", return_timestamps=timestamps)
        assert len(set(want)) > 3, "degenerate reference: the test would prove little"
        assert got[f"r{i}"]["token_ids"] == [want]
    if timestamps:  # these random decodings stop mid-segment: transformers seeks, and so must omni
        assert dec.seek_encoder is not None


def test_random_checkpoint_detects_language_like_transformers(random_dir):
    from transformers import WhisperForConditionalGeneration

    clips = noise_clips(2, seconds=2.0)
    enc, dec = make_stages(random_dir)
    got = run_stages(enc, dec, {f"r{i}": audio_params(pcm, sampling={"decoder": {"max_tokens": MAX_NEW}})
                                for i, pcm in enumerate(clips)})
    model = WhisperForConditionalGeneration.from_pretrained(random_dir, dtype=torch.float32).eval()
    codes = {v: k.strip("<|>") for k, v in model.generation_config.lang_to_id.items()}
    for i, pcm in enumerate(clips):
        mel = log_mel(pad_window(pcm), 80)[None]
        with torch.inference_mode():
            lang = int(model.detect_language(mel)[0])
        assert got[f"r{i}"]["events"][0]["language"] == codes[lang]
        assert got[f"r{i}"]["token_ids"] == [hf_generate(random_dir, pcm, task="transcribe")]


@pytest.fixture(scope="module")
def tiny_en(tmp_path_factory):
    return converted_tiny_en(tmp_path_factory.mktemp("whisper-real"))


@pytest.mark.parametrize("timestamps", [False, True])
def test_real_tiny_en_tokens_equal_transformers(tiny_en, tmp_path, timestamps):
    clips = [speak(text, tmp_path, f"s{i}") for i, text in enumerate(SENTENCES[:3])]
    enc, dec = make_stages(tiny_en)
    got = run_stages(enc, dec, {f"r{i}": audio_params(pcm, timestamps=timestamps,
                                                      sampling={"decoder": {"max_tokens": MAX_NEW}})
                                for i, pcm in enumerate(clips)})
    for i, pcm in enumerate(clips):
        want = hf_generate(tiny_en, pcm, return_timestamps=timestamps)
        assert got[f"r{i}"]["token_ids"] == [want]
    assert "smooth planks" in got["r0"]["text"].lower()
    if timestamps:
        seg = got["r0"]["events"][0]["segments"][0]
        assert 0.0 <= seg["start"] < seg["end"] <= len(clips[0]) / 16000 + 0.02


def test_real_tiny_en_previous_text_prompt_equals_transformers(tiny_en, tmp_path):
    from transformers import AutoProcessor, WhisperForConditionalGeneration

    pcm = speak(SENTENCES[0], tmp_path, "prompt")
    prompt = "Birch canoe, smooth planks."
    enc, dec = make_stages(tiny_en)
    got = run_stages(enc, dec, {"r": audio_params(pcm, prompt=prompt, sampling={"decoder": {"max_tokens": MAX_NEW}})})
    proc = AutoProcessor.from_pretrained(tiny_en)
    model = WhisperForConditionalGeneration.from_pretrained(tiny_en, dtype=torch.float32).eval()
    with torch.inference_mode():
        want = model.generate(log_mel(pad_window(pcm), 80)[None], max_new_tokens=MAX_NEW,
                              prompt_ids=proc.get_prompt_ids(prompt, return_tensors="pt"))[0].tolist()
    assert got["r"]["token_ids"] == [want]


def test_preempted_windows_decode_the_same(random_dir):
    """A KV cache for one max-length sequence and 12 windows at once: the engine preempts and
    recomputes (cross-attention keys/values stay with the sequence), and the tokens do not change."""
    clips = noise_clips(12, seconds=1.0)
    requests = {f"r{i}": audio_params(pcm, language="en", sampling={"decoder": {"max_tokens": MAX_NEW}})
                for i, pcm in enumerate(clips)}
    roomy = run_stages(*make_stages(random_dir), requests)
    enc, dec = make_stages(random_dir, num_blocks=28, block_size=16)
    tight = run_stages(enc, dec, requests)
    assert dec.engine.scheduler.num_preemptions > 0
    assert {r: v["token_ids"] for r, v in tight.items()} == {r: v["token_ids"] for r, v in roomy.items()}


def test_windows_beyond_max_num_seqs_wait_their_turn(random_dir):
    clips = noise_clips(5, seconds=1.0)
    requests = {f"r{i}": audio_params(pcm, language="en", sampling={"decoder": {"max_tokens": 8}})
                for i, pcm in enumerate(clips)}
    roomy = run_stages(*make_stages(random_dir), requests)
    enc, dec = make_stages(random_dir, max_num_seqs=2)
    peak, add = [0], dec.engine.add_request

    def counting_add(*args, **kwargs):
        seq = add(*args, **kwargs)
        peak[0] = max(peak[0], len(dec.engine.seqs))
        return seq

    dec.engine.add_request = counting_add
    tight = run_stages(enc, dec, requests)
    assert peak[0] == 2
    assert {r: v["token_ids"] for r, v in tight.items()} == {r: v["token_ids"] for r, v in roomy.items()}
    assert dec.engine.stats()["running"] == 0 and not dec.requests
