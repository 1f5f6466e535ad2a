"""Real speech through omnid with the real Whisper tiny.en weights: espeak-ng reads 24 Harvard
sentences (4 clips of 4, and one 8-sentence clip over 30 s); omnid's transcripts have a word error
rate at most a little above transformers' own Whisper on the same audio; 16 concurrent
transcriptions equal each alone; timestamps; bad audio gets a clear 4xx; a Whisper served beside
another main model (the embedded default's layout)."""

from __future__ import annotations

import concurrent.futures as cf

import numpy as np
import pytest
import torch

from test_whisper_support import (
    SENTENCES,
    WhisperServer,
    converted_tiny_en,
    require_espeak,
    speak_clip,
    wav_bytes,
    wer,
)

SHORT = [SENTENCES[i:i + 4] for i in range(0, 16, 4)]
LONG = SENTENCES[16:24]
WER_MARGIN = 0.05  # omni may be at most this much worse than transformers on the same audio


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    require_espeak()
    root = tmp_path_factory.mktemp("speech")
    short = [speak_clip(s, root, f"c{i}") for i, s in enumerate(SHORT)]
    long = speak_clip(LONG, root, "long", pause_s=2.0)
    assert len(long) / 16000 > 30.0 and all(len(c) / 16000 < 30.0 for c in short)
    return short, long


@pytest.fixture(scope="module")
def tiny_en(tmp_path_factory):
    return converted_tiny_en(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="module")
def server(tiny_en):
    with WhisperServer(tiny_en) as srv:
        yield srv


@pytest.fixture(scope="module")
def alone(server, clips):
    """Each clip transcribed on its own (json), in order: 4 short, then the long one."""
    short, long = clips
    out = []
    for pcm in [*short, long]:
        resp = server.transcribe(wav_bytes(pcm))
        assert resp.status_code == 200, resp.text
        out.append(resp.json()["text"])
    return out


def transformers_texts(model_dir, clips) -> list[str]:
    from transformers import AutoProcessor, WhisperForConditionalGeneration

    short, long = clips
    proc = AutoProcessor.from_pretrained(model_dir)
    model = WhisperForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        feats = proc(short, sampling_rate=16000, return_tensors="pt").input_features
        ids = model.generate(feats, max_new_tokens=200)
        texts = proc.batch_decode(ids, skip_special_tokens=True)
        inputs = proc(long, sampling_rate=16000, return_tensors="pt", truncation=False, padding="longest",
                      return_attention_mask=True)
        ids = model.generate(inputs.input_features, attention_mask=inputs.attention_mask, return_timestamps=True)
        texts += proc.batch_decode(ids, skip_special_tokens=True)
    return texts


def test_word_error_rate_is_close_to_transformers(server, clips, alone, tiny_en, record_property):
    refs = [" ".join(s) for s in [*SHORT, LONG]]
    ours = wer(refs, alone)
    theirs = wer(refs, transformers_texts(tiny_en, clips))
    record_property("wer_omni", ours)
    record_property("wer_transformers", theirs)
    print(f"\nWER over {len(SENTENCES)} espeak-ng sentences, Whisper tiny.en: omni {ours:.3f}, "
          f"transformers {theirs:.3f}")
    assert ours <= theirs + WER_MARGIN
    assert ours < 0.5, "the transcripts should mostly be right"


def test_long_audio_is_windowed_and_stitched(server, clips, alone):
    short, long = clips
    text = alone[-1]
    assert wer([" ".join(LONG)], [text]) < 0.5
    assert "flame and heat" in text.lower() and "far short" in text.lower()  # first and last sentences
    resp = server.transcribe(wav_bytes(long), response_format="verbose_json")
    body = resp.json()
    assert resp.status_code == 200 and body["duration"] > 30.0
    starts = [s["start"] for s in body["segments"]]
    assert starts == sorted(starts) and starts[-1] > 30.0 and body["segments"][-1]["end"] <= body["duration"]
    assert body["language"] == "en"


def test_sixteen_concurrent_transcriptions_equal_each_alone(server, clips, alone):
    short, _ = clips
    jobs = [i % len(short) for i in range(16)]
    with cf.ThreadPoolExecutor(16) as pool:
        resps = list(pool.map(lambda i: server.transcribe(wav_bytes(short[i])), jobs))
    assert all(r.status_code == 200 for r in resps)
    assert [r.json()["text"] for r in resps] == [alone[i] for i in jobs]


def test_subtitles_have_one_cue_per_segment(server, clips):
    pcm = clips[0][0]
    body = server.transcribe(wav_bytes(pcm), response_format="verbose_json").json()
    srt = server.transcribe(wav_bytes(pcm), response_format="srt").text
    vtt = server.transcribe(wav_bytes(pcm), response_format="vtt").text
    segments = body["segments"]
    assert segments and all(0.0 <= s["start"] < s["end"] <= body["duration"] + 1e-6 for s in segments)
    assert srt.count(" --> ") == len(segments) and vtt.startswith("WEBVTT") and vtt.count(" --> ") == len(segments)


def test_bad_audio_is_a_clear_4xx(server, tiny_en):
    silent = server.transcribe(wav_bytes(np.zeros(16000, np.float32)))
    assert silent.status_code == 400 and "silent" in silent.json()["error"]["message"]
    empty = server.transcribe(b"")
    assert empty.status_code == 400 and "empty" in empty.json()["error"]["message"]
    corrupt = server.transcribe(b"RIFF\x00\x00\x00\x00WAVEnot really a wav file at all")
    assert corrupt.status_code == 400 and "decode" in corrupt.json()["error"]["message"]
    with WhisperServer(tiny_en, max_audio_seconds=5.0) as small:
        too_long = small.transcribe(wav_bytes(0.1 * np.ones(16000 * 6, np.float32)))
    assert too_long.status_code == 413 and "limit" in too_long.json()["error"]["message"]
    unknown = server.transcribe(wav_bytes(0.1 * np.ones(1600, np.float32)), language="xx")
    assert unknown.status_code == 400 and "language" in unknown.json()["error"]["message"]


def test_whisper_beside_a_main_model(tiny_en, clips, alone):
    import requests

    with WhisperServer(tiny_en, beside_demo=True) as srv:
        names = [m["id"] for m in requests.get(f"{srv.url}/v1/models", timeout=10).json()["data"]]
        assert names[:2] == ["omni-demo", srv.info.id] and "whisper-1" in names and "tts-1" in names
        wav = wav_bytes(clips[0][1])
        by_name, by_main = srv.transcribe(wav), srv.transcribe(wav, model="omni-demo")
        assert by_name.status_code == by_main.status_code == 200
        assert by_name.json()["text"] == by_main.json()["text"] == alone[1]
        chat = requests.post(f"{srv.url}/v1/chat/completions", timeout=10,
                             json={"model": srv.info.id, "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 400 and "transcriptions" in chat.json()["error"]["message"]
        health = requests.get(f"{srv.url}/health", timeout=10).json()
        assert health["stages"][f"{srv.info.id}/decoder"] == "up"
        metrics = requests.get(f"{srv.url}/metrics", timeout=10).text
        assert f'stage="{srv.info.id}/decoder' in metrics and 'stage="generator' in metrics


@pytest.mark.parametrize("fmt,subtype,rate,channels", [("FLAC", "PCM_16", 44100, 2), ("OGG", "VORBIS", 22050, 1),
                                                       ("MP3", "MPEG_LAYER_III", 48000, 2)])
def test_any_format_rate_and_channels(server, clips, alone, fmt, subtype, rate, channels):
    import io

    import soundfile as sf
    import soxr

    pcm = soxr.resample(clips[0][0], 16000, rate)
    data = np.stack([pcm] * channels, axis=1) if channels == 2 else pcm
    buf = io.BytesIO()
    sf.write(buf, data, rate, format=fmt, subtype=subtype)
    resp = server.transcribe(buf.getvalue())
    assert resp.status_code == 200, resp.text
    ref = " ".join(SHORT[0])
    assert wer([ref], [resp.json()["text"]]) <= wer([ref], [alone[0]]) + 0.1  # lossy codecs may flip a word or two


@pytest.mark.parametrize("container,codec,rate", [("webm", "libopus", 48000), ("ipod", "aac", 44100),
                                                  ("mp4", "aac", 16000)])
def test_what_browsers_and_phones_record(server, clips, alone, container, codec, rate):
    """MediaRecorder's webm/opus, iOS's m4a/aac and mp4 audio, decoded through PyAV."""
    import soxr

    from test_api_support import av_bytes

    upload = av_bytes(soxr.resample(clips[0][0], 16000, rate), rate, container, codec)
    resp = server.transcribe(upload)
    assert resp.status_code == 200, resp.text
    ref = " ".join(SHORT[0])
    assert wer([ref], [resp.json()["text"]]) <= wer([ref], [alone[0]]) + 0.1


def test_stages_as_processes_give_the_same_text(tiny_en, clips, alone):
    """What `omnid serve` runs by default: each stage its own process, encoder outputs over shared memory."""
    with WhisperServer(tiny_en, mode="process") as srv:
        resp = srv.transcribe(wav_bytes(clips[0][2]))
        timed = srv.transcribe(wav_bytes(clips[0][2]), response_format="verbose_json")
    assert resp.status_code == 200 and resp.json()["text"] == alone[2]
    assert timed.status_code == 200 and timed.json()["segments"][0]["end"] > 0.0
