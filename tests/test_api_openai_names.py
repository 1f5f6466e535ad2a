"""What an OpenAI user sends unchanged: OpenAI's model names as aliases of the served model of that
task, `tools` refused with a clear 400, CORS for browser clients, and /v1/models telling the truth
about which model transcribes."""

from __future__ import annotations

import numpy as np
import openai
import pytest
import requests

from omni.api.app import ServedModel, ServerConfig, ServerState
from omni.models.registry import ModelInfo
from test_api_support import LiveServer
from test_whisper_support import WhisperServer, tiny_random_checkpoint, wav_bytes

FEW = {"generator": {"max_tokens": 4}}


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    return tiny_random_checkpoint(tmp_path_factory.mktemp("whisper") / "whisper-tiny-random")


@pytest.fixture(scope="module")
def beside(whisper_dir):
    """The embedded default's layout: a main model (the demo: chat and speech) and a Whisper beside it."""
    with WhisperServer(whisper_dir, beside_demo=True) as srv:
        yield srv


def test_openai_names_resolve_to_the_model_of_their_task(beside):
    client = openai.OpenAI(base_url=beside.url + "/v1", api_key="x", max_retries=0, timeout=60)
    cards = {m.id: m for m in client.models.list().data}
    for alias in ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe"):
        assert cards[alias].model_extra["root"] == beside.info.id
    for alias in ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o", "gpt-4o-mini", "gpt-4o-audio-preview"):
        assert cards[alias].model_extra["root"] == "omni-demo"
    assert client.models.retrieve("whisper-1").id == "whisper-1"
    audio = wav_bytes(0.1 * np.sin(np.arange(16000) / 8.0).astype(np.float32))
    direct = beside.transcribe(audio)
    via_alias = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", audio, "audio/wav"))
    assert direct.status_code == 200 and via_alias.text == direct.json()["text"]
    speech = client.audio.speech.create(model="tts-1", voice="tone", input="hi", response_format="wav")
    assert speech.content[:4] == b"RIFF"
    chat = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                          extra_body={"stage_sampling": FEW})
    assert chat.model == "gpt-4o" and len(chat.choices[0].message.content) == 4
    with pytest.raises(openai.BadRequestError, match="transcriptions"):  # whisper-1 is not a chat model
        client.chat.completions.create(model="whisper-1", messages=[{"role": "user", "content": "hi"}])


def test_no_alias_for_a_task_nobody_serves():
    with LiveServer() as srv:  # the demo alone: nothing transcribes
        names = [m["id"] for m in requests.get(srv.url + "/v1/models", timeout=10).json()["data"]]
        assert "whisper-1" not in names and "tts-1" in names
        resp = requests.post(srv.url + "/v1/audio/transcriptions", timeout=10, data={"model": "whisper-1"},
                             files={"file": ("a.wav", b"RIFF", "audio/wav")})
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"


def test_models_do_not_claim_a_side_models_transcriptions():
    """A random-weight main model that could transcribe hands transcriptions to the real Whisper
    beside it: its card says it does not transcribe, the Whisper's (and whisper-1's) say it does."""
    from omni.api.routes_info import _model_card

    main = ModelInfo(id="tiny-omni", family="qwen3-omni", speaks=True, transcribes=True, random_weights=True)
    whisper = ModelInfo(id="whisper-tiny.en", family="whisper", transcribes=True, tasks=("transcribe",))
    state = ServerState(None, main, [], ServerConfig(), extra_models=[ServedModel(None, whisper, [])])
    assert _model_card(state, "tiny-omni")["transcribes"] is False
    assert _model_card(state, "whisper-tiny.en")["transcribes"] is True
    assert _model_card(state, "whisper-1") == {**_model_card(state, "whisper-tiny.en"), "id": "whisper-1"}
    alone = ServerState(None, main, [], ServerConfig())  # nothing better: the main model does it
    assert _model_card(alone, "tiny-omni")["transcribes"] is True


@pytest.fixture(scope="module")
def live():
    config = ServerConfig(port=0, allowed_origins=["http://app.example"])
    with LiveServer(config=config) as srv:
        yield srv


def test_tools_are_refused_with_a_clear_400(live):
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0, timeout=30)
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="omni-demo", messages=[{"role": "user", "content": "hi"}], tools=[tool])
    error = info.value.body
    assert error["param"] == "tools" and error["code"] == "unsupported_parameter"
    assert "tool calling is not supported" in error["message"]
    for extra, param in (({"response_format": {"type": "json_object"}}, "response_format"),
                         ({"prediction": {"type": "content", "content": "x"}}, "prediction"), ({"tool_choice": "auto"}, "tool_choice")):
        resp = requests.post(live.url + "/v1/chat/completions", timeout=10,
                             json={"model": "omni-demo", "messages": [{"role": "user", "content": "hi"}], **extra})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
    fine = client.chat.completions.create(model="omni-demo", messages=[{"role": "user", "content": "hi"}],
                                          response_format={"type": "text"}, tool_choice="none",
                                          extra_body={"stage_sampling": FEW})
    assert len(fine.choices[0].message.content) == 4


def test_cors_for_allowed_origins(live):
    origin = {"Origin": "http://app.example"}
    pre = requests.options(live.url + "/v1/chat/completions", timeout=10,
                           headers={**origin, "Access-Control-Request-Method": "POST",
                                    "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 204 and pre.headers["Access-Control-Allow-Origin"] == "http://app.example"
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    assert pre.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    body = {"model": "omni-demo", "messages": [{"role": "user", "content": "hi"}], "stage_sampling": FEW}
    whole = requests.post(live.url + "/v1/chat/completions", json=body, headers=origin, timeout=10)
    streamed = requests.post(live.url + "/v1/chat/completions", json={**body, "stream": True}, headers=origin,
                             timeout=10)
    refused = requests.post(live.url + "/v1/chat/completions", json={**body, "tools": [{}]}, headers=origin,
                            timeout=10)
    for resp in (whole, streamed, refused):
        assert resp.headers["Access-Control-Allow-Origin"] == "http://app.example"
    other = requests.get(live.url + "/v1/models", headers={"Origin": "http://evil.example"}, timeout=10)
    assert "Access-Control-Allow-Origin" not in other.headers
    bad_pre = requests.options(live.url + "/v1/models", timeout=10,
                               headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "GET"})
    assert bad_pre.status_code == 403
