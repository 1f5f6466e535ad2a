"""Qwen3-Omni (tiny, one process per stage): one request never hurts another.

A prompt longer than the context is a 400 before the work is done (30 MB of text: by its
characters, at the API and at preprocess; a few thousand tokens: by its token count), the stage
lives on and a concurrent chat is served. A stage's death fails only the requests it holds:
killing the vision encoder during text chats, or preprocess while requests decode downstream in
the thinker and talker, they all complete, and new text chats are served while it restarts."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import requests

from omni.api.app import build_app
from omni.api.server import HttpServer
from omni.kernel.errors import InvalidRequest
from omni.models.qwen3_omni.graph import build
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from qwen3_fixtures import LoopThread, RunningKernel, params, prompts, summarize

pytest.importorskip("transformers")

TOKENS = 120


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    ckpt = str(make_tiny(tmp_path_factory.mktemp("faults"), seed=0, preset="tiny-a"))
    graph, info = build(ckpt)
    loop = LoopThread()
    try:
        with RunningKernel(loop, graph) as kernel:
            app = build_app(kernel.kernel, info, [s.name for s in graph.stages])
            kernel.http = loop.run(HttpServer(app, "127.0.0.1", 0).start())
            yield kernel
            loop.run(kernel.http.stop())
    finally:
        loop.close()


def _chat(modalities=("text",), tokens: int = TOKENS) -> dict:
    return params(prompts()["text"], modalities=modalities, thinker_tokens=tokens, talker_tokens=tokens,
                  ignore_eos=True)


async def _until(predicate, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def _kill_during(running, stage: str, make, n: int = 3, left: str | None = None):
    """Start n requests, wait for each one's first output (and for it to leave `left`), SIGKILL
    `stage`, serve one more text chat while it restarts; return every result."""
    kernel = running.kernel

    async def main():
        streams = [kernel.submit(make()) for _ in range(n)]
        firsts = [await s.__anext__() for s in streams]
        if left:
            await _until(lambda: all(left not in kernel.holders(s.rid) for s in streams))
        os.kill(kernel.pid_of(stage), signal.SIGKILL)
        await _until(lambda: kernel.health()[stage] != "up")
        during = None
        if stage != "preprocess":  # a text chat needs preprocess; it skips the vision encoder
            during = summarize(await kernel.submit(_chat(tokens=4)).collect())
        done = [summarize([f, *await s.collect()]) for f, s in zip(firsts, streams)]
        await _until(lambda: kernel.health()[stage] == "up")
        after = summarize(await kernel.submit(_chat(tokens=4)).collect())
        return done, during, after

    return running.loop.run(main(), timeout=180)


def test_killing_the_vision_encoder_spares_text_chats(running):
    done, during, after = _kill_during(running, "vision_encoder", _chat)
    assert [len(r.tokens) for r in done] == [TOKENS] * 3
    assert len(during.tokens) == 4 and len(after.tokens) == 4


def test_killing_preprocess_spares_requests_decoding_downstream(running):
    done, _, after = _kill_during(running, "preprocess", lambda: _chat(("text", "audio"), 40), left="preprocess")
    assert [len(r.tokens) for r in done] == [40] * 3 and all(len(r.pcm) > 0 for r in done)
    assert len(after.tokens) == 4


def test_a_prompt_longer_than_the_context_is_a_400_and_hurts_nobody(running):
    kernel, url = running.kernel, running.http.url + "/v1/chat/completions"
    pid, restarts = kernel.pid_of("preprocess"), kernel.restarts_total["preprocess"]
    huge = {"model": "x", "messages": [{"role": "user", "content": "y" * (30 << 20)}]}
    huge["model"] = requests.get(running.http.url + "/v1/models", timeout=10).json()["data"][0]["id"]

    async def main():
        live = asyncio.ensure_future(kernel.submit(_chat(tokens=30)).collect())
        over_chars = kernel.submit(params([{"role": "user", "content": "z" * (30 << 20)}], modalities=("text",)))
        with pytest.raises(InvalidRequest, match="characters"):
            await over_chars.collect()
        over_tokens = kernel.submit(params([{"role": "user", "content": "ab" * 2100}], modalities=("text",)))
        with pytest.raises(InvalidRequest, match=r"tokens; the model's context is 4096"):
            await over_tokens.collect()
        return summarize(await live)

    live = running.loop.run(main(), timeout=120)
    r = requests.post(url, json=huge, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text[:300]
    assert len(live.tokens) == 30
    assert kernel.pid_of("preprocess") == pid and kernel.restarts_total["preprocess"] == restarts
    ok = requests.post(url, json={**huge, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
                       timeout=60)
    assert ok.status_code == 200, ok.text


def test_a_poisoned_audio_request_among_twelve_streams_fails_alone(running):
    """Float WAV samples at 1e38 (finite, but the features overflow to NaN): a 400 at the API; the
    12 streams live meanwhile complete and the requests after it succeed."""
    import base64
    import io
    import threading

    import numpy as np
    import soundfile as sf

    url = running.http.url + "/v1/chat/completions"
    model = requests.get(running.http.url + "/v1/models", timeout=10).json()["data"][0]["id"]

    def body(content, **extra):
        return {"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0, **extra}

    def wav(value: float) -> str:
        buf = io.BytesIO()
        sf.write(buf, np.full(16000, value, np.float32), 16000, format="WAV", subtype="FLOAT")
        return base64.b64encode(buf.getvalue()).decode()

    results = []

    def stream():
        with requests.post(url, json=body("talk", stream=True, max_tokens=60, ignore_eos=True), stream=True,
                           timeout=120) as r:
            lines = [line for line in r.iter_lines() if line.startswith(b"data: ")]
            results.append((r.status_code, len(lines), lines[-1] if lines else b"", any(b'"error"' in x for x in lines)))

    threads = [threading.Thread(target=stream) for _ in range(12)]
    for t in threads:
        t.start()
    poisoned = requests.post(url, json=body([{"type": "input_audio", "input_audio": {"data": wav(1e38),
                                                                                    "format": "wav"}}]), timeout=60)
    for t in threads:
        t.join(120)
    assert poisoned.status_code == 400 and "audio samples must lie within" in poisoned.json()["error"]["message"]
    assert len(results) == 12 and all(status == 200 and chunks > 10 and last == b"data: [DONE]" and not error
                                    for status, chunks, last, error in results), results
    parts = [{"type": "text", "text": "hear"},
             {"type": "input_audio", "input_audio": {"data": wav(0.5), "format": "wav"}}]
    after = [requests.post(url, json=body(parts, max_tokens=4), timeout=60) for _ in range(3)]
    assert all(r.status_code == 200 for r in after), [r.text for r in after]
