"""Total memory budgets (issue 25, point 1): what every client together makes omnid hold in one
resource is bounded, the client past it gets an OpenAI-shaped 429 (`memory_budget_exceeded`), and
/metrics reports it. Small budgets here (a demo server, in-process) so that it runs fast."""

from __future__ import annotations

import asyncio
import base64
import re

import aiohttp
import numpy as np
import pytest
import requests

from omni.api.budgets import Budget, default_limits
from omni.api.errors import ApiError
from omni.api.state import ServerConfig
from omni.api.media import MediaLimits
from omni.api.realtime.route import SOCKETS
from test_api_support import LiveServer

SESSIONS = 32
SECOND = 16000 * 4  # what one second of input audio takes in a session's buffer (16 kHz float32)
ONE_SECOND_PCM16 = base64.b64encode((np.sin(np.arange(24000) / 9) * 8000).astype("<i2").tobytes()).decode()


def test_a_lease_past_the_budget_is_refused_and_holds_what_it_held():
    budget = Budget("uploads", 100)
    a, b = budget.lease(), budget.lease()
    a.resize(60)
    with pytest.raises(ApiError) as err:
        b.resize(50)
    assert err.value.status == 429 and err.value.code == "memory_budget_exceeded"
    assert "request bodies" in err.value.message and " at 0x" not in err.value.message
    assert (budget.used, b.bytes, budget.refusals) == (60, 0, 1)
    b.resize(40)
    a.close()
    b.settle(200)  # already held: counted, not refused
    assert budget.used == 200 and budget.peak == 200


def test_default_budgets_are_shares_of_the_machine_memory():
    limits = default_limits(64 << 30)
    assert limits == {"realtime_audio": 4 << 30, "conversation": 4 << 30, "uploads": 8 << 30, "output": 2 << 30}


@pytest.fixture(scope="module")
def server():
    config = ServerConfig(port=0, limits=MediaLimits(max_audio_seconds=1.0),
                          budgets={**default_limits(), "realtime_audio": SESSIONS * SECOND, "uploads": 1 << 20,
                                   "conversation": int(2.5 * SECOND)})
    with LiveServer(mode="inline", config=config) as srv:
        yield srv


async def _session(http: aiohttp.ClientSession, url: str) -> aiohttp.ClientWebSocketResponse:
    ws = await http.ws_connect(url.replace("http://", "ws://") + "/v1/realtime")
    assert (await ws.receive_json(timeout=10))["type"] == "session.created"
    await ws.send_json({"type": "session.update", "session": {"turn_detection": None}})
    assert (await ws.receive_json(timeout=10))["type"] == "session.updated"
    return ws


async def _answer(ws, event: dict) -> dict | None:
    """Send `event`; the error it caused, or None (a probe event after it proves it was handled)."""
    await ws.send_json(event)
    await ws.send_json({"type": "omni.probe"})
    reply = await ws.receive_json(timeout=10)
    if reply["type"] == "error" and reply["error"]["code"] != "invalid_event_type":
        assert (await ws.receive_json(timeout=10))["error"]["code"] == "invalid_event_type"
        return reply["error"]
    return None


def _metric(url: str, name: str, resource: str) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    return float(re.search(rf'{name}{{resource="{resource}"}} (\S+)', text).group(1))


def test_32_full_realtime_buffers_stay_under_the_total_budget_and_the_33rd_is_refused(server):
    budget = server.state().budgets["realtime_audio"]
    append = {"type": "input_audio_buffer.append", "audio": ONE_SECOND_PCM16}

    async def go():
        async with aiohttp.ClientSession() as http:
            sockets = [await _session(http, server.url) for _ in range(SESSIONS + 1)]
            try:
                for ws in sockets[:SESSIONS]:  # each fills its own buffer (1 s here)
                    assert await _answer(ws, append) is None
                assert 0.95 * budget.limit < budget.used <= budget.limit
                refused = await _answer(sockets[SESSIONS], append)
                assert refused is not None and refused["code"] == "memory_budget_exceeded", refused
                assert refused["type"] == "rate_limit_error" and "Realtime input audio" in refused["message"]
                assert budget.used <= budget.limit and budget.peak <= budget.limit
                assert _metric(server.url, "omni_memory_budget_used_bytes", "realtime_audio") == budget.used
                assert _metric(server.url, "omni_memory_budget_refusals_total", "realtime_audio") >= 1
                # room made by one session is room for another
                await sockets[0].send_json({"type": "input_audio_buffer.clear"})
                assert (await sockets[0].receive_json(timeout=10))["type"] == "input_audio_buffer.cleared"
                assert await _answer(sockets[SESSIONS], append) is None
            finally:
                for ws in sockets:
                    await ws.close()

    asyncio.run(asyncio.wait_for(go(), 60))
    sockets = server.servers[0].app[SOCKETS]
    assert asyncio.run(_until(lambda: budget.used == 0 and not sockets)), (budget.used, len(sockets))
    # closed sessions give their buffers back, and their places among the open sessions


async def _until(condition, timeout: float = 5.0) -> bool:
    for _ in range(int(timeout / 0.05)):
        if condition():
            return True
        await asyncio.sleep(0.05)
    return condition()


def test_conversations_share_one_budget(server):
    item = {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_audio", "audio": ONE_SECOND_PCM16}]}}

    async def go():
        async with aiohttp.ClientSession() as http:
            sockets = [await _session(http, server.url) for _ in range(3)]
            errors = []
            for ws in sockets:  # 1 s each (the per-session bound), 2.5 s for all
                await ws.send_json(item)
                reply = await ws.receive_json(timeout=10)
                errors.append(reply["error"]["code"] if reply["type"] == "error" else None)
            for ws in sockets:
                await ws.close()
            return errors

    assert asyncio.run(asyncio.wait_for(go(), 30)) == [None, None, "memory_budget_exceeded"]
    assert asyncio.run(_until(lambda: server.state().budgets["conversation"].used == 0))


def test_an_upload_past_the_uploads_budget_is_refused_before_it_is_read(server):
    body = b'{"model": "omni-demo", "messages": [{"role": "user", "content": "' + b"a" * (2 << 20) + b'"}]}'
    resp = requests.post(server.url + "/v1/chat/completions", data=body, timeout=30,
                         headers={"Content-Type": "application/json"})
    assert resp.status_code == 429, resp.text
    assert resp.json()["error"]["code"] == "memory_budget_exceeded"
    assert server.state().budgets["uploads"].used == 0
    ok = requests.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": "omni-demo", "messages": [{"role": "user", "content": "hi"}],
        "stage_sampling": {"generator": {"max_tokens": 2}}})
    assert ok.status_code == 200 and server.state().budgets["uploads"].used == 0


def test_a_memory_budget_flag_sets_one_and_the_others_keep_the_machine_defaults():
    from omni.api.cli import CliError, memory_budgets

    assert memory_budgets(["realtime_audio=512", "output=1.5"]) == {
        **default_limits(), "realtime_audio": 512 << 20, "output": int(1.5 * (1 << 20))}
    for bad in ("voice_cache=5", "uploads", "uploads=abc", "uploads=0", "uploads=-3", "uploads=nan", "uploads=inf"):
        with pytest.raises(CliError) as err:
            memory_budgets([bad])
        assert "--memory-budget-mb" in str(err.value) and "\n" not in str(err.value), bad


def test_the_default_shares_are_the_ones_readme_and_help_document():
    """README and --help say each default as a share of the machine's memory: they are the code's."""
    from fractions import Fraction
    from pathlib import Path

    from omni.api.budgets import DEFAULT_SHARES
    from omni.api.cli import build_parser

    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    section = readme[readme.index("**Memory budgets in total**"):][:1500]
    for name, share in DEFAULT_SHARES.items():
        found = re.search(rf"\(`{name}`, (?:default )?1/(\d+)", section)
        assert found and Fraction(1, int(found.group(1))) == Fraction(share).limit_denominator(1000), name
    import argparse

    parsers, actions = [build_parser()], []
    while parsers:
        for action in parsers.pop()._actions:
            actions.append(action)
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
    help_text = " ".join(next(a.help for a in actions if a.dest == "memory_budgets").split())
    shares = re.search(r"default: ([\d/, and]+) of this machine", help_text).group(1)
    documented = [Fraction(1, int(d)) for d in re.findall(r"1/(\d+)", shares)]
    assert documented == [Fraction(s).limit_denominator(1000) for s in DEFAULT_SHARES.values()]
    assert re.search(r"resource: " + ", ".join(DEFAULT_SHARES), help_text)


def test_metrics_report_every_budget_by_resource(server):
    from omni.api.budgets import RESOURCES

    state = server.state()
    for resource in RESOURCES:
        assert _metric(server.url, "omni_memory_budget_limit_bytes", resource) == state.budgets[resource].limit
        assert _metric(server.url, "omni_memory_budget_used_bytes", resource) == state.budgets[resource].used
        assert _metric(server.url, "omni_memory_budget_peak_bytes", resource) >= 0
        assert _metric(server.url, "omni_memory_budget_refusals_total", resource) >= 0
    assert state.budgets["voice_cache"].limit == state.config.voice_cache_bytes


def _chunked_upload_then_stall(url: str, path: str, content_type: bytes, body: bytes) -> tuple[bytes, float]:
    """Send `body` chunked (no Content-Length) and then nothing more: the server's first answer line
    and how long it took (a server that waits for the rest answers only at its body timeout, 60 s)."""
    import socket
    import time

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=15) as s:
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: " + content_type
                  + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        t0 = time.monotonic()
        for i in range(0, len(body), 64 << 10):
            piece = body[i:i + (64 << 10)]
            s.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
        reply = s.recv(4096)
        return reply.split(b"\r\n", 1)[0], time.monotonic() - t0


def test_a_chunked_upload_is_held_on_the_budget_as_it_arrives(server):
    """No Content-Length: the body counts against the uploads budget (1 MiB here) while it arrives,
    so past it the client gets its 429 at once instead of the server holding what it sends."""
    budget = server.state().budgets["uploads"]
    chat = b'{"model": "omni-demo", "messages": [{"role": "user", "content": "' + b"a" * (3 << 19)
    status, took = _chunked_upload_then_stall(server.url, "/v1/chat/completions", b"application/json", chat)
    assert b" 429 " in status and took < 10, (status, took)
    boundary = b"xyzzy"
    form = (b"--" + boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            b"Content-Type: audio/wav\r\n\r\n" + b"\0" * (3 << 19))
    status, took = _chunked_upload_then_stall(server.url, "/v1/audio/transcriptions",
                                              b"multipart/form-data; boundary=" + boundary, form)
    assert b" 429 " in status and took < 10, (status, took)
    assert asyncio.run(_until(lambda: budget.used == 0)) and budget.peak <= budget.limit
