"""Trouble: admission full -> 429, disconnects free every stage's state, a stage killed mid-stream
ends that stream with an error event and the server keeps serving, /health names dead stages."""

from __future__ import annotations

import os
import signal
import time

import openai
import pytest
import requests

from omni.api.app import ServerConfig, build_app
from omni.api.server import HttpServer
from omni.models.registry import ModelInfo
from test_api_support import LiveServer

MODEL = "omni-demo"
SLOW = {"generator": {"step_delay_s": 0.02}}


def long_chat(stream: bool = True, tokens: int = 400) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "talk a lot"}], "stream": stream,
            "stage_sampling": {"generator": {"max_tokens": tokens}}}


def wait_for(predicate, timeout: float = 10.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("condition not reached in time")


def stages_idle(server) -> bool:
    stats = server.run(server.kernel.stats())
    return (stats["kernel"]["in_flight"] == 0 and stats["generator.0"].get("running") == 0
            and stats["vocoder.0"].get("running") == 0 and stats["encoder.0"].get("open") == 0)


@pytest.fixture(scope="module")
def inline_server():
    short_deadline = ServerConfig(port=0, request_timeout_s=0.3)
    with LiveServer(mode="inline", max_inflight=1, stage_args=SLOW, extra_configs=[short_deadline]) as srv:
        yield srv


def test_deadline_is_504_and_frees_state(inline_server):
    r = requests.post(inline_server.servers[1].url + "/v1/chat/completions", json=long_chat(stream=False),
                      timeout=10)
    assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded"
    wait_for(lambda: stages_idle(inline_server), timeout=3.0)


def test_overloaded_is_429_and_disconnect_frees_it(inline_server):
    url = inline_server.url + "/v1/chat/completions"
    first = requests.post(url, json=long_chat(), stream=True, timeout=30)
    lines = first.iter_lines()
    assert next(line for line in lines if line.startswith(b"data: "))
    second = requests.post(url, json=long_chat(stream=False, tokens=2), timeout=10)
    assert second.status_code == 429 and second.headers["Retry-After"] == "1"
    assert second.json()["error"]["code"] == "overloaded"
    client = openai.OpenAI(base_url=inline_server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    first.close()  # the client goes away mid-stream
    wait_for(lambda: stages_idle(inline_server), timeout=3.0)  # the request alone needs 8 s
    ok = requests.post(url, json=long_chat(stream=False, tokens=2), timeout=10)
    assert ok.status_code == 200, ok.text


def test_client_timeout_on_a_whole_response_cancels_it(inline_server):
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(inline_server.url + "/v1/chat/completions", json=long_chat(stream=False), timeout=0.3)
    wait_for(lambda: stages_idle(inline_server), timeout=3.0)  # the request alone needs 8 s
    stats = inline_server.run(inline_server.kernel.stats())
    assert stats["generator.0"]["aborted"] >= 1


def test_speech_stream_disconnect_frees_state(inline_server):
    body = {"model": MODEL, "voice": "tone", "input": "long speech", "response_format": "pcm",
            "stage_sampling": {"generator": {"max_tokens": 400}}}
    r = requests.post(inline_server.url + "/v1/audio/speech", json=body, stream=True, timeout=30)
    assert next(r.iter_content(256))
    r.close()
    wait_for(lambda: stages_idle(inline_server), timeout=3.0)  # the request alone needs 8 s


class _StubKernel:
    """Only what /health asks: a kernel whose vocoder does not answer."""

    def health(self):
        return {"encoder": "up", "generator": "up", "vocoder": "restarting"}

    async def probe(self, timeout_s: float = 1.0):
        return {"encoder": True, "generator": True, "vocoder": False}

    def capabilities(self):
        return {}  # every stage is core: a silent one is a 503

    async def stop(self):
        pass


def test_health_is_503_naming_stages_that_do_not_answer():
    server = LiveServer()  # used only for its loop thread
    server.thread.start()
    try:
        app = build_app(_StubKernel(), ModelInfo(id="m", family="demo"), ["encoder", "generator", "vocoder"])
        http = server.run(HttpServer(app, "127.0.0.1", 0).start())
        r = requests.get(http.url + "/health", timeout=10)
        assert r.status_code == 503
        assert "vocoder (restarting)" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "vocoder"
        server.run(http.stop())
    finally:
        server.loop.call_soon_threadsafe(server.loop.stop)
        server.thread.join(5)


def test_stage_killed_mid_stream_gives_error_event_then_recovers():
    with LiveServer(mode="process", stage_args=SLOW) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)
        stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                stream=True, extra_body={"stage_sampling": {
                                                    "generator": {"max_tokens": 400}}})
        it = iter(stream)
        next(it)
        os.kill(srv.kernel.pid_of("generator"), signal.SIGKILL)
        with pytest.raises(openai.APIError, match="stage"):
            for _ in it:
                pass
        wait_for(lambda: srv.kernel.health()["generator"] != "up", timeout=5, every=0.01)
        down = requests.post(srv.url + "/v1/chat/completions", json=long_chat(stream=False, tokens=2), timeout=10)
        assert down.status_code == 503 and "generator" in down.json()["error"]["message"]
        wait_for(lambda: requests.get(srv.url + "/health", timeout=10).status_code == 200, timeout=30, every=0.2)
        again = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                               extra_body={"stage_sampling": {"generator": {"max_tokens": 3}}})
        assert len(again.choices[0].message.content) == 3
        metrics = requests.get(srv.url + "/metrics", timeout=10).text
        assert 'omni_stage_restarts_total{stage="generator.0"} 1.0' in metrics


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_a_stage_past_its_budget_degrades_health_serves_text_then_comes_back(mode):
    """The vocoder crashes past its budget: text chat is still served, speech is a 503 naming it,
    /health is 200 and says audio output is degraded; after the cool-down speech works again."""
    changes = {"vocoder": {"max_restarts": 1, "restart_cooldown_s": 2.0}}
    with LiveServer(mode=mode, spec_changes=changes) as srv:
        speech = {"model": MODEL, "voice": "tone", "input": "hello", "response_format": "pcm",
                  "stage_sampling": {"generator": {"max_tokens": 3}}}
        for _ in range(2):
            wait_for(lambda: srv.kernel.health()["vocoder"] == "up", timeout=20)
            srv.loop.call_soon_threadsafe(srv.kernel.kill, "vocoder")
            wait_for(lambda: srv.kernel.health()["vocoder"] != "up", timeout=5, every=0.01)
        wait_for(lambda: srv.kernel.health()["vocoder"] == "down", timeout=5)
        health = requests.get(srv.url + "/health", timeout=10)
        assert health.status_code == 200 and health.json()["degraded"] == ["audio_output"], health.text
        text = requests.post(srv.url + "/v1/chat/completions", json=long_chat(stream=False, tokens=3), timeout=10)
        assert text.status_code == 200 and len(text.json()["choices"][0]["message"]["content"]) == 3
        down = requests.post(srv.url + "/v1/audio/speech", json=speech, timeout=10)
        assert down.status_code == 503 and "vocoder" in down.json()["error"]["message"]
        wait_for(lambda: requests.get(srv.url + "/health", timeout=10).json().get("status") == "ok", timeout=20)
        again = requests.post(srv.url + "/v1/audio/speech", json=speech, timeout=10)
        assert again.status_code == 200 and len(again.content) == 3 * 480 * 2
