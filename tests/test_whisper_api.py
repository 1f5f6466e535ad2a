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
        by_name, by_alias = srv.transcribe(wav), srv.transcribe(wav, model="whisper-1")
        assert by_name.status_code == by_alias.status_code == 200
        assert by_name.json()["text"] == by_alias.json()["text"] == alone[1]
        by_main = srv.transcribe(wav, model="omni-demo")  # the demo does not transcribe: never another's transcript
        assert by_main.status_code == 400 and by_main.json()["error"]["param"] == "model"
        assert by_main.json()["error"]["message"].startswith("model 'omni-demo' does not transcribe; for "
                                                             "/v1/audio/transcriptions use ")
        assert "'whisper-1'" in by_main.json()["error"]["message"]
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


def test_streamed_transcription_is_sse_text_deltas(server, clips, alone):
    """stream=true: one transcript.text.delta per decoded window, in order, then transcript.text.done
    with the whole text (what json gives); the official client reads the events."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    events = list(client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav_bytes(clips[1]), "audio/wav"),
                                                     stream=True))
    assert [e.type for e in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1) and len(events) >= 3
    assert events[-1].type == "transcript.text.done" and events[-1].text == alone[-1]
    assert "".join(e.delta for e in events[:-1]).strip() == alone[-1]  # the 35 s clip, streamed as decoded
    assert len(events) > 20  # token by token, not one delta per 30 s window
    short = server.transcribe(wav_bytes(clips[0][0]), stream="true", response_format="text")
    assert short.headers["Content-Type"].startswith("text/event-stream") and "transcript.text.done" in short.text
    refused = server.transcribe(wav_bytes(clips[0][0]), stream="true", response_format="srt")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "stream"


def test_unserved_transcription_fields_are_refused(server, clips):
    wav = wav_bytes(clips[0][0])
    bad = server.transcribe(wav, response_format="verbose_json", **{"timestamp_granularities[]": "letter"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "timestamp_granularities[]"
    needs_verbose = server.transcribe(wav, **{"timestamp_granularities[]": "segment"})
    assert needs_verbose.status_code == 400 and "verbose_json" in needs_verbose.json()["error"]["message"]
    unknown = server.transcribe(wav, chunking_strategy="auto")
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "chunking_strategy"
    segment = server.transcribe(wav, response_format="verbose_json", **{"timestamp_granularities[]": "segment"})
    assert segment.status_code == 200 and segment.json()["segments"]


def test_verbose_json_statistics_are_transformers(server, clips, tiny_en):
    """avg_logprob: the chosen tokens' log-probabilities under the decoding rules, end-of-text
    included, over text tokens + 1 (transformers' `_retrieve_avg_logprobs`, openai-whisper's);
    no_speech_prob: P(<|nocaptions|>) at <|startoftranscript|>. Both against transformers' own."""
    from transformers import AutoProcessor, WhisperForConditionalGeneration

    pcm = clips[0][0][:16000 * 4]  # one sentence and a bit: one window, one pass
    body = server.transcribe(wav_bytes(pcm), response_format="verbose_json").json()
    proc = AutoProcessor.from_pretrained(tiny_en)
    model = WhisperForConditionalGeneration.from_pretrained(tiny_en, dtype=torch.float32).eval()
    feats = proc(pcm, sampling_rate=16000, return_tensors="pt").input_features
    with torch.inference_mode():
        out = model.generate(feats, max_new_tokens=200, return_timestamps=True, return_dict_in_generate=True,
                             output_scores=True)
        window = out["segments"][0][0]  # its segments share one pass (one "result")
        scores = [s.reshape(-1, s.shape[-1])[0] for s in window["result"]["scores"]]  # the processed logits
        generated = window["result"]["sequences"].reshape(-1)[-len(scores):]
        logprobs = torch.stack([torch.log_softmax(s.float(), -1)[t] for s, t in zip(scores, generated)])
        eot = model.generation_config.eos_token_id
        text_tokens = int((generated != eot).sum())
        avg = float(logprobs[: text_tokens + 1].sum()) / (text_tokens + 1)
        sot_logits = model(input_features=feats, decoder_input_ids=torch.tensor([[model.generation_config.decoder_start_token_id]])).logits[0, -1]
        no_speech = float(torch.softmax(sot_logits, -1)[model.generation_config.no_timestamps_token_id - 1])
    segments = body["segments"]
    assert len({s["avg_logprob"] for s in segments}) == 1  # one pass: its segments share its statistics
    assert segments[0]["avg_logprob"] == pytest.approx(avg, abs=2e-3)
    assert segments[0]["no_speech_prob"] == pytest.approx(no_speech, abs=1e-4)
    assert -1.0 < avg < 0.0 and no_speech < 0.2  # clear speech
    assert all(0.5 < s["compression_ratio"] < 2.4 for s in segments)  # openai-whisper flags > 2.4 as repetition
    assert all(s["temperature"] == 0.0 for s in segments)


def test_word_timestamps_are_transformers(server, clips, tiny_en):
    """timestamp_granularities[]=word: each word starts where transformers' token timestamps (cross-
    attention of the alignment heads + DTW, `return_token_timestamps`) put its first token."""
    import openai
    from transformers import AutoProcessor, WhisperForConditionalGeneration

    pcm = np.concatenate([clips[0][0][:16000 * 3], np.zeros(8000, np.float32)])  # one sentence
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    got = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav_bytes(pcm), "audio/wav"),
                                             response_format="verbose_json", timestamp_granularities=["word", "segment"])
    proc = AutoProcessor.from_pretrained(tiny_en)
    model = WhisperForConditionalGeneration.from_pretrained(tiny_en, dtype=torch.float32).eval()
    feats = proc(pcm, sampling_rate=16000, return_tensors="pt").input_features
    with torch.inference_mode():
        out = model.generate(feats, max_new_tokens=100, return_timestamps=True, return_token_timestamps=True,
                             num_frames=len(pcm) // 160, return_dict_in_generate=True)
    eot = model.generation_config.eos_token_id
    tokens = [(int(t), float(s)) for seg in out["segments"][0] for t, s in zip(seg["tokens"], seg["token_timestamps"])
              if int(t) < eot]
    starts = [s for t, s in tokens if proc.tokenizer.decode([t]).startswith(" ") or t == tokens[0][0]]
    words = got.words
    assert " ".join(w.word for w in words) == got.text.strip() and len(words) == len(starts) >= 5
    assert [w.start for w in words] == pytest.approx(starts, abs=0.021)
    assert all(w.start <= w.end <= got.duration for w in words)
    assert all(a.end == b.start for a, b in zip(words, words[1:]))
    assert got.segments and got.segments[0].avg_logprob < 0
