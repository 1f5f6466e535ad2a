"""Hostile clients against omnid (demo model, inline): each one gets an OpenAI-shaped 4xx, at once,
and nobody else notices. Deep JSON, a huge header, media that decodes huge or to nonsense, image
fetches that would map ports, /metrics behind the key, slow clients."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
import time

import numpy as np
import pytest
import requests

from omni.api.app import ServerConfig
from omni.api.media import MediaLimits
from test_api_bad_input import check_error
from test_api_support import LiveServer

MODEL = "omni-demo"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server():
    plain = ServerConfig(port=0, limits=MediaLimits(image_hosts=["127.0.0.1"], fetch_timeout_s=2.0),
                         header_timeout_s=1.0, body_timeout_s=1.0, write_timeout_s=1.0)
    keyed = ServerConfig(port=0, api_key="sekrit")
    public = ServerConfig(port=0, api_key="sekrit", public_metrics=True)
    with LiveServer(mode="inline", config=plain, extra_configs=[keyed, public],
                    stage_args={"generator": {"step_delay_s": 0.01}}) as srv:
        yield srv


def chat(content, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "stage_sampling": {"generator": {"max_tokens": 3}}, **extra}


def audio(raw: bytes, fmt: str = "wav") -> list:
    return [{"type": "input_audio", "input_audio": {"data": base64.b64encode(raw).decode(), "format": fmt}}]


def test_deep_json_is_a_400(server):
    deep = '{"a":' * 10_000 + "1" + "}" * 10_000
    body = json.dumps(chat("x"))[:-1] + ', "metadata": ' + deep + "}"
    r = requests.post(server.url + CHAT, data=body, headers={"Content-Type": "application/json"}, timeout=10)
    check_error(r, 400, "nested too deeply")


def test_a_30_mb_prompt_is_a_400_at_once_and_the_server_serves_on(server):
    t0 = time.monotonic()
    r = requests.post(server.url + CHAT, json=chat("y" * (30 << 20)), timeout=60)
    check_error(r, 400, "context")
    assert r.json()["error"]["code"] == "context_length_exceeded" and time.monotonic() - t0 < 10
    assert requests.post(server.url + CHAT, json=chat("hi"), timeout=10).status_code == 200


def test_huge_header_is_an_openai_shaped_431(server):
    r = requests.post(server.url + CHAT, json=chat("x"), headers={"X-Big": "a" * (1 << 20)}, timeout=10)
    check_error(r, 431, "header")


def test_metrics_need_the_key_unless_public(server):
    keyed, public = server.servers[1].url, server.servers[2].url
    check_error(requests.get(keyed + "/metrics", timeout=10), 401, "API key")
    ok = requests.get(keyed + "/metrics", headers={"Authorization": "Bearer sekrit"}, timeout=10)
    assert ok.status_code == 200 and "omni_stage_" in ok.text
    assert requests.get(public + "/metrics", timeout=10).status_code == 200
    assert requests.get(keyed + "/health", timeout=10).status_code == 200


def test_api_key_from_a_file_or_the_environment(tmp_path, monkeypatch):
    from omni.api.cli import CliError, build_parser, server_config

    (tmp_path / "key").write_text("from-file\n")
    args = build_parser().parse_args(["serve", "--api-key-file", str(tmp_path / "key")])
    assert server_config(args).api_key == "from-file" and not server_config(args).public_metrics
    monkeypatch.setenv("OMNI_API_KEY", "from-env")
    assert server_config(build_parser().parse_args(["serve"])).api_key == "from-env"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(CliError, match="empty"):
        server_config(build_parser().parse_args(["serve", "--api-key-file", str(tmp_path / "empty")]))


def test_every_image_fetch_failure_reads_the_same(server):
    """Another port of the allowed host, closed or open, and a 404 on the server itself: one answer."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    urls = [f"http://127.0.0.1:{closed}/x.png", server.url + "/nothing.png", server.url + "/health"]
    bodies = []
    for url in urls:
        r = requests.post(server.url + CHAT, json=chat([{"type": "image_url", "image_url": {"url": url}}]),
                          timeout=10)
        assert r.status_code == 400, r.text
        bodies.append(r.json()["error"])
    assert bodies[0] == bodies[1] == bodies[2], bodies


def _float_wav(value: float) -> bytes:
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.full(16000, value, np.float32), 16000, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def test_audio_out_of_range_or_not_finite_is_a_400(server):
    for value in (1e38, float("inf"), float("nan")):
        r = requests.post(server.url + CHAT, json=chat(audio(_float_wav(value))), timeout=10)
        check_error(r, 400, "audio")
    ok = requests.post(server.url + CHAT, json=chat([{"type": "text", "text": "hi"}, *audio(_float_wav(0.5))]),
                       timeout=10)
    assert ok.status_code == 200, ok.text


def _flac_claiming(seconds: int, rate: int = 192000, channels: int = 8) -> bytes:
    """A FLAC of one second of silence whose header says it lasts `seconds` (STREAMINFO's total)."""
    import soundfile as sf

    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", samplerate=rate, channels=channels, format="FLAC", subtype="PCM_16") as f:
        f.write(np.zeros((rate, channels), np.int16))
    raw = bytearray(buf.getvalue())
    field = int.from_bytes(raw[18:26], "big")  # rate(20) channels(3) bits(5) total samples(36)
    raw[18:26] = ((field & ~((1 << 36) - 1)) | seconds * rate).to_bytes(8, "big")
    return bytes(raw)


def test_large_decoded_size_is_a_413_at_once_and_stalls_nobody(server):
    gaps, stop = [], threading.Event()

    def stream():
        body = {**chat("talk"), "stream": True, "stage_sampling": {"generator": {"max_tokens": 300}}}
        with requests.post(server.url + CHAT, json=body, stream=True, timeout=30) as r:
            last = time.monotonic()
            for line in r.iter_lines():
                now = time.monotonic()
                if line:
                    gaps.append(now - last)
                    last = now
                if stop.is_set():
                    break

    streamer = threading.Thread(target=stream)
    streamer.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    r = requests.post(server.url + CHAT, json=chat(audio(_flac_claiming(590), "flac")), timeout=30)
    took = time.monotonic() - t0
    stop.set()
    streamer.join(30)
    check_error(r, 413, "decodes to")
    assert took < 1.0 and max(gaps) < 0.5, (took, max(gaps))


def test_many_short_clips_share_one_audio_bound(server):
    """Each clip is inside the limit; together they are not (a 413 naming the total)."""
    clip = _flac_claiming(1, rate=16000, channels=1)  # one second, truly
    parts = [{"type": "text", "text": "hear"}, *[p for _ in range(3) for p in audio(clip, "flac")]]
    ok = requests.post(server.url + CHAT, json=chat(parts), timeout=30)
    assert ok.status_code == 200, ok.text
    many = [{"type": "text", "text": "hear"}, *[p for _ in range(601) for p in audio(clip, "flac")]]
    check_error(requests.post(server.url + CHAT, json=chat(many), timeout=60), 413, "in all")


def _slow_client(url: str, body: bool) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    if body:
        s.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Content-Length: 100000\r\n\r\n{".encode())
    else:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    return s


def _trickle_until_closed(s: socket.socket, limit_s: float, byte: bytes) -> tuple[float, bytes]:
    t0, got = time.monotonic(), b""
    s.settimeout(0.2)
    while time.monotonic() - t0 < limit_s:
        try:
            s.sendall(byte)
        except OSError:
            break
        try:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        except socket.timeout:
            pass
        except OSError:
            break
    return time.monotonic() - t0, got


def test_slow_headers_and_bodies_time_out(server):
    head, body = _slow_client(server.url, body=False), _slow_client(server.url, body=True)
    try:
        took_head, _ = _trickle_until_closed(head, 10, b"a")  # a header name that never ends
        took_body, answer = _trickle_until_closed(body, 10, b" ")
    finally:
        head.close()
        body.close()
    assert 0.9 < took_head < 3 and 0.9 < took_body < 3, (took_head, took_body, answer)
    assert b" 408 " in answer.split(b"\r\n", 1)[0] and b"body_timeout" in answer


def test_a_client_that_stops_reading_is_cut_off_and_its_request_cancelled():
    """A speech stream to a client that reads nothing: once the socket buffers are full, past the
    write timeout its request is gone (the whole answer would take minutes)."""
    with LiveServer(mode="inline", config=ServerConfig(port=0, write_timeout_s=1.0)) as server:
        _stop_reading(server)


def _stop_reading(server) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    body = json.dumps({"model": MODEL, "voice": "tone", "input": "say a lot", "response_format": "pcm",
                       "stage_sampling": {"generator": {"max_tokens": 100_000}}}).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((host, int(port)))
    try:
        s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.5)
        assert server.kernel.inflight == 1
        t0 = time.monotonic()
        while server.kernel.inflight and time.monotonic() - t0 < 20:
            time.sleep(0.1)
        assert server.kernel.inflight == 0, server.run(server.kernel.stats())["generator.0"]
        print(f"a client that stopped reading was cut off after {time.monotonic() - t0 + 0.5:.1f} s")
    finally:
        s.close()


def test_sigterm_exits_within_the_drain_timeout_whatever_the_clients_do():
    """Five clients trickle headers or bodies (timeouts far off); SIGTERM still exits inside --drain-timeout."""
    import signal

    from test_api_cli import omnid, read_until_listening

    proc = omnid("serve", "--model", "demo", "--mode", "inline", "--port", "0", "--drain-timeout", "3",
                 "--header-timeout", "60", "--body-timeout", "60")
    clients = []
    try:
        url, _ = read_until_listening(proc)
        clients = [_slow_client(url, body=i % 2 == 1) for i in range(5)]
        for i, c in enumerate(clients):
            c.sendall(b" " if i % 2 else b"a")  # a body byte, or a header name that never ends
        time.sleep(0.3)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        took = time.monotonic() - t0
    finally:
        for c in clients:
            c.close()
        proc.kill()
    assert proc.returncode == 0 and took < 3.0, (proc.returncode, took)
    print(f"SIGTERM to exit with five slow clients: {took:.2f} s (drain timeout 3 s)")
