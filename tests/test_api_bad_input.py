"""Hand-made malformed requests: every one gets a 4xx with an OpenAI error body, never a 5xx."""

from __future__ import annotations

import base64
import json

import pytest
import requests

from omni.api.app import ServerConfig
from omni.api.media import MediaLimits
from test_api_support import LiveServer, png_data_url, wav_bytes

MODEL = "omni-demo"
LIMITS = MediaLimits(max_audio_seconds=2.0, max_audio_bytes=100_000)


@pytest.fixture(scope="module")
def server():
    config = ServerConfig(port=0, max_body_bytes=1 << 20, limits=LIMITS)
    keyed = ServerConfig(port=0, api_key="sekrit", limits=LIMITS)
    with LiveServer(mode="inline", config=config, extra_configs=[keyed]) as srv:
        yield srv


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def user(content) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}]}


def audio_part(data: str, fmt: str = "wav") -> list:
    return [{"type": "input_audio", "input_audio": {"data": data, "format": fmt}}]


def image_part(url: str) -> list:
    return [{"type": "image_url", "image_url": {"url": url}}]


WAV = wav_bytes(0.5)
CHAT = "/v1/chat/completions"
SPEECH = "/v1/audio/speech"
CASES = {
    "bad json": (CHAT, b'{"model": "omni-demo", "messages": [', 400, "not valid JSON"),
    "empty body": (CHAT, b"", 400, "empty"),
    "body is a list": (CHAT, b"[1, 2]", 400, "expected a JSON object, but got an array"),
    "messages wrong type": (CHAT, {"model": MODEL, "messages": "hi"}, 400, "messages"),
    "no messages": (CHAT, {"model": MODEL, "messages": []}, 400, "messages"),
    "missing model": (CHAT, {"messages": [{"role": "user", "content": "x"}]}, 400, "model"),
    "bad role": (CHAT, {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    "unknown part type": (CHAT, user([{"type": "video", "video": "x"}]), 400, "type"),
    "temperature too high": (CHAT, {**user("x"), "temperature": 7}, 400, "temperature"),
    "temperature string": (CHAT, {**user("x"), "temperature": "hot"}, 400, "temperature"),
    "n=0": (CHAT, {**user("x"), "n": 0}, 400, "Invalid 'n': expected an integer >= 1, but got 0"),
    "n=17": (CHAT, {**user("x"), "n": 17}, 400, "Invalid 'n': expected an integer <= 16, but got 17"),
    "n=2 with audio": (CHAT, {**user("x"), "n": 2, "modalities": ["text", "audio"], "audio": {"voice": "tone"}}, 400,
                       "n=2 answers are served as text only"),
    "max_tokens zero": (CHAT, {**user("x"), "max_tokens": 0}, 400, "max_tokens"),
    "unknown stage": (CHAT, {**user("x"), "stage_sampling": {"nope": {"temperature": 0}}}, 400, "unknown stage"),
    "unknown sampling field": (CHAT, {**user("x"), "stage_sampling": {"generator": {"warmth": 1}}}, 400, "warmth"),
    "a stage rejects the params": (CHAT, {**user("x"), "stage_sampling": {"generator": {"max_tokens": 200_000}}},
                                   400, "max_tokens"),
    "stage rejects, streamed": (CHAT, {**user("x"), "stream": True,
                                       "stage_sampling": {"generator": {"max_tokens": 200_000}}}, 400, "max_tokens"),
    "bad modality": (CHAT, {**user("x"), "modalities": ["smell"]}, 400, "modalities"),
    "streamed wav audio": (CHAT, {**user("x"), "stream": True, "modalities": ["text", "audio"],
                                  "audio": {"voice": "tone", "format": "wav"}}, 400, "pcm16"),
    "unknown voice": (CHAT, {**user("x"), "modalities": ["text", "audio"], "audio": {"voice": "zz"}}, 400, "tone"),
    "unknown model": (CHAT, {**user("x"), "model": "gpt-5"}, 404, "not served"),
    "bad base64 audio": (CHAT, user(audio_part("!!!not base64!!!")), 400, "base64"),
    "not audio": (CHAT, user(audio_part(b64(b"hello, I am text"))), 400, "could not decode"),
    "truncated audio": (CHAT, user(audio_part(b64(WAV[:30]))), 400, "could not decode"),
    "audio too long": (CHAT, user(audio_part(b64(wav_bytes(3.0, rate=8000)))), 413, "limit"),
    "audio bytes too many": (CHAT, user(audio_part(b64(wav_bytes(1.5, rate=48000)))), 413, "limit"),
    "bad audio format name": (CHAT, user(audio_part(b64(WAV), "aiff")), 400, "format"),
    "image file path": (CHAT, user(image_part("/etc/passwd")), 400, "never"),
    "image file url": (CHAT, user(image_part("file:///etc/passwd")), 400, "never"),
    "remote image": (CHAT, user(image_part("http://example.com/cat.png")), 400, "allow-list"),
    "image not an image": (CHAT, user(image_part("data:image/png;base64," + b64(b"nope"))), 400, "image"),
    "image bad base64": (CHAT, user(image_part("data:image/png;base64,%%%")), 400, "base64"),
    "image data url not image": (CHAT, user(image_part("data:text/plain;base64," + b64(b"x"))), 400, "image/"),
    "huge body": (CHAT, {**user("x" * (2 << 20))}, 413, "too large"),
    "speech empty input": (SPEECH, {"model": MODEL, "voice": "tone", "input": ""}, 400, "input"),
    "speech blank input": (SPEECH, {"model": MODEL, "voice": "tone", "input": "   "}, 400, "blank"),
    "speech bad speed": (SPEECH, {"model": MODEL, "voice": "tone", "input": "x", "speed": 9}, 400, "speed"),
    "speech bad format": (SPEECH, {"model": MODEL, "voice": "tone", "input": "x", "response_format": "ogg-vorbis"},
                          400, "response_format"),
    "speech unknown voice": (SPEECH, {"model": MODEL, "voice": "nobody", "input": "x"}, 400, "tone"),
    "speech missing voice": (SPEECH, {"model": MODEL, "input": "x"}, 400, "voice"),
}


def check_error(r: requests.Response, status: int, needle: str) -> None:
    assert r.status_code == status, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert needle.lower() in err["message"].lower(), err


@pytest.mark.parametrize("name", list(CASES))
def test_malformed_json_requests(server, name):
    path, body, status, needle = CASES[name]
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = requests.post(server.url + path, data=data, headers={"Content-Type": "application/json"}, timeout=30)
    check_error(r, status, needle)


def test_malformed_transcription_forms(server):
    url = server.url + "/v1/audio/transcriptions"
    check_error(requests.post(url, json={"model": MODEL}, timeout=10), 400, "multipart")
    check_error(requests.post(url, files={"file": ("a.wav", WAV)}, timeout=10), 400, "model")
    check_error(requests.post(url, data={"model": MODEL}, files={"x": ("a", b"1")}, timeout=10), 400, "file")
    check_error(requests.post(url, data={"model": MODEL, "response_format": "doc"}, files={"file": ("a", WAV)},
                              timeout=10), 400, "response_format")
    check_error(requests.post(url, data={"model": MODEL, "temperature": "warm"}, files={"file": ("a", WAV)},
                              timeout=10), 400, "temperature")
    bad = requests.post(url, data=b"--xx\r\nbroken", headers={"Content-Type": "multipart/form-data; boundary=xx"},
                        timeout=10)
    assert 400 <= bad.status_code < 500, bad.text


def test_routes_and_methods(server):
    check_error(requests.get(server.url + "/v1/nothing", timeout=10), 404, "no such route")
    check_error(requests.get(server.url + CHAT, timeout=10), 405, "not allowed")


def test_api_key(server):
    keyed = server.servers[1].url
    body = {**user("x"), "stage_sampling": {"generator": {"max_tokens": 2}}}
    check_error(requests.post(keyed + CHAT, json=body, timeout=10), 401, "API key")
    check_error(requests.post(keyed + CHAT, json=body, headers={"Authorization": "Bearer wrong"}, timeout=10),
                401, "API key")
    ok = requests.post(keyed + CHAT, json=body, headers={"Authorization": "Bearer sekrit"}, timeout=10)
    assert ok.status_code == 200, ok.text
    assert requests.get(keyed + "/health", timeout=10).status_code == 200  # probes stay open


def test_good_media_still_passes_the_checks(server):
    body = user([{"type": "text", "text": "hi"}, *audio_part(b64(WAV)), *image_part(png_data_url())])
    body["stage_sampling"] = {"generator": {"max_tokens": 2}}
    r = requests.post(server.url + CHAT, json=body, timeout=30)
    assert r.status_code == 200, r.text


def test_no_5xx_was_counted(server):
    metrics = requests.get(server.url + "/metrics", timeout=10).text
    statuses = [line for line in metrics.splitlines() if line.startswith("omni_requests_total")]
    assert statuses and not [s for s in statuses if 'status="5' in s], statuses
