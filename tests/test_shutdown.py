"""Shutdown ends every stream with a final event (issue 25, point 2): SIGTERM to omnid's whole
process group (systemd's default KillMode) while 8 streams and a Realtime session run: the stages
keep serving through the drain, every SSE client gets an error event naming the shutdown then
`[DONE]`, the Realtime client an `error` event then close code 1001, a new request a 503 at once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import aiohttp
import pytest
import requests

from omni.kernel.kernel import Kernel
from omni.models.demo.stages import demo_graph
from test_api_cli import alive, omnid, read_until_listening

MODEL = "omni-demo"
LONG = {"generator": {"max_tokens": 5000}}  # 50 s at 10 ms a token: far past the drain


def _sse_events(url: str, path: str, body: dict, out: list, started: threading.Event) -> None:
    with requests.post(url + path, json=body, stream=True, timeout=60) as r:
        lines = []
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                lines.append(line[6:])
                started.set()
        out.append((r.status_code, lines))


async def _realtime(url: str, started: threading.Event) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url.replace("http://", "ws://") + "/v1/realtime") as ws:
            await ws.send_json({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "long"}]}})
            await ws.send_json({"type": "response.create", "response": {"stage_sampling": LONG}})
            events = []
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    events.append(json.loads(msg.data))
                    if events[-1]["type"] == "response.output_audio.delta":
                        started.set()
            return {"code": ws.close_code, "errors": [e["error"] for e in events if e["type"] == "error"]}


async def _new_session_status(url: str) -> int:
    async with aiohttp.ClientSession() as http:
        try:
            async with http.ws_connect(url.replace("http://", "ws://") + "/v1/realtime", timeout=5):
                return 101
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status


def test_sigterm_to_the_process_group_during_8_streams_gives_every_client_a_final_event():
    proc = omnid("serve", "--model", "demo", "--port", "0", "--drain-timeout", "4",
                 "--set", "generator.args.step_delay_s=0.01", start_new_session=True)
    try:
        url, _ = read_until_listening(proc)
        metrics = requests.get(url + "/metrics", timeout=10).text
        pids = [int(float(line.split()[-1])) for line in metrics.splitlines() if line.startswith("omni_stage_pid{")]
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "talk"}], "stream": True,
                "stage_sampling": LONG}
        speech = {"model": MODEL, "voice": "tone", "input": "talk", "stream_format": "sse", "response_format": "pcm",
                  "stage_sampling": LONG}
        results: list = []
        started = [threading.Event() for _ in range(9)]
        threads = [threading.Thread(target=_sse_events, args=(url, "/v1/chat/completions", chat, results, started[i]))
                   for i in range(4)]
        threads += [threading.Thread(target=_sse_events, args=(url, "/v1/audio/speech", speech, results, started[i]))
                    for i in range(4, 8)]
        realtime: dict = {}
        threads.append(threading.Thread(target=lambda: realtime.update(asyncio.run(_realtime(url, started[8])))))
        for t in threads:
            t.start()
        assert all(e.wait(30) for e in started)
        os.killpg(proc.pid, signal.SIGTERM)  # omnid and every stage, as systemd does
        time.sleep(0.3)
        refused = requests.post(url + "/v1/chat/completions", json={**chat, "stream": False}, timeout=5)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        assert asyncio.run(_new_session_status(url)) == 503  # a new Realtime session too, before the upgrade
        assert requests.get(url + "/health", timeout=5).status_code == 503  # a balancer stops sending
        assert all(alive(p) for p in pids)  # the stages serve on through the drain
        for t in threads:
            t.join(30)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert len(results) == 8
    for status, lines in results:
        assert status == 200 and len(lines) > 3
        error = json.loads(lines[-2])["error"]
        assert lines[-1] == b"[DONE]" and error["code"] == "shutting_down" and "shutting down" in error["message"]
    assert realtime["code"] == 1001 and realtime["errors"][-1]["code"] == "shutting_down", realtime
    time.sleep(0.2)
    assert not [p for p in pids if alive(p)]  # and they left when omnid told them


def test_a_stage_defers_sigterm_while_its_kernel_lives_and_leaves_when_told():
    async def go():
        kernel = Kernel(demo_graph(), mode="process")
        await kernel.start()
        try:
            pid = kernel.pid_of("generator")
            os.kill(pid, signal.SIGTERM)
            await asyncio.sleep(0.5)
            events = await kernel.submit({"prompt": "hi", "max_tokens": 4}, deadline_s=20).collect()
            assert events[-1].final and alive(pid) and kernel.health()["generator"] == "up"
        finally:
            await kernel.stop()
        return pid

    pid = asyncio.run(asyncio.wait_for(go(), 60))
    time.sleep(0.2)
    assert not alive(pid)


def test_a_stage_whose_kernel_is_gone_stops_at_sigterm():
    """The other half of the deferral: with its parent gone (PR_SET_PDEATHSIG) SIGTERM stops it."""
    from omni.cluster import proc

    stopped = []
    actor = type("A", (), {"stop": lambda self: stopped.append(True), "name": "x"})()
    proc._on_signal(actor, os.getppid(), signal.SIGTERM)  # its parent lives
    assert stopped == []
    proc._on_signal(actor, -1, signal.SIGTERM)
    assert stopped == [True]
