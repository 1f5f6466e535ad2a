"""The official `openai` client against a live omnid (demo family, inline kernel) on loopback."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import openai
import pytest
import requests
import soundfile as sf

from omni.models.demo.stages import SAMPLES_PER_FRAME
from test_api_support import LiveServer, png_data_url, wav_bytes

MODEL = "omni-demo"
FEW = {"generator": {"max_tokens": 6}}  # the demo's text stage is `generator`


@pytest.fixture(scope="module")
def server():
    with LiveServer(mode="inline") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def chat(client, text="hello there", **kw):
    kw.setdefault("extra_body", {"stage_sampling": FEW})
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], **kw)


def test_models_list_and_retrieve(client):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids[0] == MODEL  # then OpenAI's names of the tasks it does (chat and speech; it does not transcribe)
    assert set(ids[1:]) == {"gpt-4o", "gpt-4o-mini", "gpt-4o-audio-preview", "gpt-4o-mini-audio-preview",
                            "gpt-realtime", "gpt-realtime-mini", "gpt-4o-realtime-preview",
                            "gpt-4o-mini-realtime-preview", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"}
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_chat_text_whole_and_streamed_agree(client):
    whole = chat(client)
    choice = whole.choices[0]
    assert choice.finish_reason == "length"
    assert len(choice.message.content) == 6 and whole.usage.completion_tokens == 6
    assert whole.usage.prompt_tokens == len("hello there")
    assert choice.message.audio is None
    chunks = list(chat(client, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content  # the demo is deterministic for a prompt
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_stop_string_truncates_whole_and_streamed(client):
    full = chat(client, "a longer prompt for stop", extra_body={"stage_sampling": {"generator": {"max_tokens": 12}}})
    text = full.choices[0].message.content
    stop = text[4:6]
    expect = text[:text.find(stop)]
    sb = {"stage_sampling": {"generator": {"max_tokens": 12}}}
    cut = chat(client, "a longer prompt for stop", stop=[stop], extra_body=sb)
    assert cut.choices[0].message.content == expect and cut.choices[0].finish_reason == "stop"
    streamed = chat(client, "a longer prompt for stop", stop=stop, stream=True, extra_body=sb)
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expect
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "pcm16"])
def test_chat_audio_whole(client, fmt):
    resp = chat(client, modalities=["text", "audio"], audio={"voice": "Tone", "format": fmt})
    msg = resp.choices[0].message
    audio = base64.b64decode(msg.audio.data)
    assert msg.audio.transcript == msg.content and msg.audio.id.startswith("audio_")
    assert msg.audio.expires_at > 0
    expected = 6 * SAMPLES_PER_FRAME  # one 20 ms frame per token at 24 kHz
    if fmt == "pcm16":
        assert len(audio) == 2 * expected
        return
    pcm, rate = sf.read(io.BytesIO(audio), dtype="float32")
    assert rate in (24000, 48000)
    if fmt in ("wav", "flac"):
        assert len(pcm) == expected and np.abs(pcm).max() > 0.1


def test_chat_audio_streamed_is_incremental_and_equals_whole(client):
    whole = chat(client, "speak", modalities=["text", "audio"], audio={"voice": "tone", "format": "pcm16"})
    chunks = list(chat(client, "speak", stream=True, modalities=["text", "audio"],
                       audio={"voice": "tone", "format": "pcm16"}))
    pieces = [c.choices[0].delta.audio for c in chunks if c.choices and c.choices[0].delta.audio]
    data = [base64.b64decode(p.data) for p in pieces if p.data]
    transcript = "".join(p.transcript or "" for p in pieces)
    assert len(data) >= 2  # streamed as made, not at the end
    assert b"".join(data) == base64.b64decode(whole.choices[0].message.audio.data)
    assert transcript == whole.choices[0].message.content


def test_chat_accepts_audio_and_image_inputs(client):
    content = [
        {"type": "text", "text": "describe"},
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_bytes()).decode(), "format": "wav"}},
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_bytes(fmt="FLAC")).decode(),
                                                "format": "flac"}},
        {"type": "image_url", "image_url": {"url": png_data_url()}},
    ]
    resp = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          extra_body={"stage_sampling": FEW})
    assert len(resp.choices[0].message.content) == 6


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "pcm"])
def test_speech_formats(client, fmt):
    audio = client.audio.speech.create(model=MODEL, voice="TONE", input="say this", response_format=fmt,
                                       extra_body={"stage_sampling": FEW}).content
    if fmt == "pcm":
        assert len(audio) == 2 * 6 * SAMPLES_PER_FRAME
    else:
        pcm, _ = sf.read(io.BytesIO(audio), dtype="float32")
        assert len(pcm) > 0


def test_speech_and_chat_audio_as_aac(client, server):
    """OpenAI's `aac` format: ADTS frames, streamed as encoded; the sound is the wav's."""
    from omni.api.av_audio import decode

    wav = client.audio.speech.create(model=MODEL, voice="tone", input="say this", response_format="wav",
                                     extra_body={"stage_sampling": FEW}).content
    reference, _ = sf.read(io.BytesIO(wav), dtype="float32")
    resp = requests.post(server.url + "/v1/audio/speech", timeout=30, stream=True,
                         json={"model": MODEL, "voice": "tone", "input": "say this", "response_format": "aac",
                               "stage_sampling": FEW})
    assert resp.headers["Content-Type"] == "audio/aac"
    aac = resp.content
    assert aac[:2] == b"\xff\xf1"  # an ADTS frame header: MPEG-4 AAC, no CRC
    pcm, rate, _ = decode(aac, 60)
    assert rate == 24000 and abs(len(pcm) - len(reference)) <= 2048  # AAC pads to whole 1024-sample frames
    delay = int(np.argmax(np.correlate(pcm[:len(reference) + 2048], reference, "valid")))  # the encoder's delay
    assert np.corrcoef(pcm[delay:delay + len(reference)], reference)[0, 1] > 0.95
    msg = chat(client, modalities=["text", "audio"], audio={"voice": "tone", "format": "aac"}).choices[0].message
    assert base64.b64decode(msg.audio.data)[:2] == b"\xff\xf1"


def test_speech_speed_resamples(client):
    normal = client.audio.speech.create(model=MODEL, voice="tone", input="fast", response_format="pcm",
                                        extra_body={"stage_sampling": FEW}).content
    fast = client.audio.speech.create(model=MODEL, voice="tone", input="fast", response_format="pcm", speed=2.0,
                                      extra_body={"stage_sampling": FEW}).content
    assert abs(len(fast) / len(normal) - 0.5) < 0.02


def test_speech_streamed_bytes_and_sse(client, server):
    with client.audio.speech.with_streaming_response.create(
            model=MODEL, voice="tone", input="stream me", response_format="wav",
            extra_body={"stage_sampling": {"generator": {"max_tokens": 20}}}) as resp:
        parts = list(resp.iter_bytes())
    pcm, _ = sf.read(io.BytesIO(b"".join(parts)), dtype="float32")
    assert len(pcm) == 20 * SAMPLES_PER_FRAME
    body = {"model": MODEL, "voice": "tone", "input": "sse please", "response_format": "pcm",
            "stream_format": "sse", "stage_sampling": FEW}
    r = requests.post(server.url + "/v1/audio/speech", json=body, timeout=30)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"}
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] == 6
    assert sum(len(base64.b64decode(e["audio"])) for e in events[:-1]) == 2 * 6 * SAMPLES_PER_FRAME


def test_transcription_without_a_transcribing_model_is_a_clear_400(client):
    """The asked model is named (param=model) with the one code for a model that does not serve the route."""
    for call, verb, route in ((client.audio.transcriptions.create, "transcribe", "transcriptions"),
                              (client.audio.translations.create, "translate", "translations")):
        for name in (MODEL, "gpt-4o"):
            with pytest.raises(openai.BadRequestError) as refused:
                call(model=name, file=("a.wav", wav_bytes(), "audio/wav"))
            assert refused.value.body == {
                "message": f"model {name!r} does not {verb}; no served model serves /v1/audio/{route}",
                "type": "invalid_request_error", "param": "model", "code": "model_not_supported"}


def test_unknown_voice_lists_known_ones_and_unknown_model_is_404(client):
    with pytest.raises(openai.BadRequestError, match="tone") as refused:
        client.audio.speech.create(model=MODEL, voice="nobody", input="x")
    assert refused.value.body["code"] == "unknown_voice" and refused.value.body["param"] == "voice"
    with pytest.raises(openai.BadRequestError, match="voices are: tone"):
        chat(client, modalities=["text", "audio"], audio={"voice": "nobody", "format": "wav"})
    with pytest.raises(openai.NotFoundError, match="not served"):
        client.chat.completions.create(model="gpt-5-turbo", messages=[{"role": "user", "content": "x"}])


def test_health_metrics_openapi(client, server):
    list(chat(client, stream=True))  # read to its end: a stream closed early counts as 499 (client gone)
    health = requests.get(server.url + "/health", timeout=10)
    assert health.status_code == 200 and health.json()["stages"] == {
        "encoder": "up", "generator": "up", "vocoder": "up"}
    text = requests.get(server.url + "/metrics", timeout=10).text
    assert 'omni_requests_total{route="/v1/chat/completions",status="200"}' in text
    for name in ("omni_time_to_first_token_seconds_count", "omni_time_to_first_audio_seconds_count",
                 "omni_real_time_factor_count", "omni_tokens_per_second_count",
                 'omni_stage_in_flight{stage="kernel"}', 'omni_stage_restarts_total{stage="generator.0"}'):
        assert name in text, name
    doc = requests.get(server.url + "/openapi.json", timeout=10).json()
    assert set(doc["paths"]) == {"/v1/chat/completions", "/v1/completions", "/v1/audio/speech", "/v1/audio/transcriptions",
                                 "/v1/audio/translations", "/v1/audio/voices", "/v1/audio/voices/{voice_id}", "/v1/models", "/v1/models/{model}", "/health", "/metrics", "/openapi.json"}


@pytest.fixture(scope="module")
def transcriber():
    """The demo marked as transcribing: it "transcribes" by answering the form's prompt."""
    with LiveServer(mode="inline", info_changes={"transcribes": True}) as srv:
        yield srv


def test_transcription_formats(transcriber):
    client = openai.OpenAI(base_url=transcriber.url + "/v1", api_key="x", max_retries=0, timeout=30)
    audio = ("a.flac", wav_bytes(1.25, fmt="FLAC"), "audio/flac")
    plain = client.audio.transcriptions.create(model=MODEL, file=audio, prompt="words")
    assert len(plain.text) > 0
    text = client.audio.transcriptions.create(model=MODEL, file=audio, prompt="words", response_format="text")
    assert text.strip() == plain.text
    verbose = client.audio.transcriptions.create(model=MODEL, file=audio, prompt="words", language="en",
                                                 response_format="verbose_json")
    assert verbose.text == plain.text and verbose.language == "en" and verbose.duration == pytest.approx(1.25)
    assert verbose.segments[0].end == pytest.approx(1.25)
    srt = client.audio.transcriptions.create(model=MODEL, file=audio, prompt="words", response_format="srt")
    assert srt.splitlines()[:3] == ["1", "00:00:00,000 --> 00:00:01,250", plain.text]
    vtt = client.audio.transcriptions.create(model=MODEL, file=audio, prompt="words", response_format="vtt")
    assert vtt.startswith("WEBVTT") and "00:00:00.000 --> 00:00:01.250" in vtt
