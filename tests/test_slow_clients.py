"""Clients that stop reading (issue 25, point 5): one rule for HTTP streams and WebSockets
(client_output.py), bounded in time (write timeout) and bytes (queued output per connection, and
the total `output` budget). The HTTP stream's case is in test_api_hostile."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import time
from types import SimpleNamespace

import pytest

from omni.api.client_output import ClientOutput
from omni.api.realtime.route import SOCKETS
from omni.api.state import STATE, ServerConfig, ServerState
from test_api_support import LiveServer


class _Transport:
    def __init__(self, buffered: int) -> None:
        self.buffered, self.aborted = buffered, False

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


def _request(state: ServerState, buffered: int = 0):
    return SimpleNamespace(app={STATE: state}, transport=_Transport(buffered))


def _state(**config) -> ServerState:
    return ServerState(None, None, [], ServerConfig(**config))


def test_a_connection_with_too_much_unread_output_is_cut_off_before_more_is_written():
    request = _request(_state(max_queued_output_bytes=1000), buffered=950)
    output, sent = ClientOutput(request), []

    async def send():
        sent.append(1)

    asyncio.run(output.write(40, send))  # 990 queued: within the bound
    with pytest.raises(ConnectionResetError, match="unread"):
        asyncio.run(output.write(100, send))
    assert sent == [1] and request.transport.aborted
    with pytest.raises(ConnectionResetError):  # and stays cut off
        asyncio.run(output.write(1, send))


def test_a_write_not_taken_in_within_the_timeout_cuts_the_connection_off():
    request = _request(_state(write_timeout_s=0.05))

    async def never():
        await asyncio.sleep(3600)

    with pytest.raises(ConnectionResetError, match="read nothing"):
        asyncio.run(ClientOutput(request).write(10, never))
    assert request.transport.aborted


def test_a_cancel_that_lands_as_a_write_ends_is_not_lost():
    """A barge-in cancels the Realtime response while it streams audio: the cancel often lands just
    as a write completes. (asyncio.wait_for lost it there, and the answer played to its end.)"""

    async def go():
        output, gate = ClientOutput(_request(_state())), asyncio.get_running_loop().create_future()

        async def send():
            await gate

        async def stream():
            await output.write(10, send)
            await asyncio.sleep(0)  # the next write
            return "went on"

        task = asyncio.ensure_future(stream())
        for _ in range(2):
            await asyncio.sleep(0)
        gate.set_result(None)
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    for _ in range(20):
        asyncio.run(go())


def test_queued_output_of_every_connection_shares_the_output_budget():
    state = _state(budgets={"output": 1000})
    first, second = ClientOutput(_request(state, buffered=800)), ClientOutput(_request(state, buffered=300))

    async def send():
        pass

    asyncio.run(first.write(0, send))
    assert state.budgets["output"].used == 800
    with pytest.raises(ConnectionResetError, match="output queued"):
        asyncio.run(second.write(0, send))
    first.close()
    assert state.budgets["output"].used == 0


def _frame(payload: bytes) -> bytes:
    """One masked text frame, as a client sends it."""
    mask = os.urandom(4)
    head = bytes([0x81])
    n = len(payload)
    head += bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def test_a_realtime_client_that_never_reads_is_closed_within_the_bound():
    """A session asks for a long spoken answer and reads nothing, not even the upgrade: once the socket
    buffers are full, past the write timeout (1 s here) the socket is closed and its response
    cancelled in every stage (the whole answer would take minutes)."""
    with LiveServer(mode="inline", config=ServerConfig(port=0, write_timeout_s=1.0),
                    stage_args={"generator": {"step_delay_s": 0.002}}) as server:
        host, port = server.url.removeprefix("http://").split(":")
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((host, int(port)))
        try:
            key = base64.b64encode(os.urandom(16))
            s.sendall(b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + key + b"\r\n\r\n")
            for event in ({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                        "content": [{"type": "input_text",
                                                                                     "text": "talk"}]}},
                          {"type": "response.create",
                           "response": {"stage_sampling": {"generator": {"max_tokens": 100_000}}}}):
                s.sendall(_frame(json.dumps(event).encode()))
            deadline = time.monotonic() + 10
            while not server.kernel.inflight and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.kernel.inflight == 1
            t0 = time.monotonic()
            while (server.kernel.inflight or server.servers[0].app[SOCKETS]) and time.monotonic() - t0 < 30:
                time.sleep(0.1)
            assert server.kernel.inflight == 0 and not server.servers[0].app[SOCKETS]
            assert server.state().budgets["output"].used == 0
            print(f"a Realtime client that read nothing was closed after {time.monotonic() - t0:.1f} s")
        finally:
            s.close()


def test_a_whole_answer_to_a_client_that_never_reads_is_cut_off_too():
    """Not streamed: a chat answer with its audio (megabytes of JSON) to a client that reads nothing.
    aiohttp wrote such an answer after the handler and waited on the client forever, the bytes held
    outside every budget; it goes out under the same rule now: cut off past the write timeout."""
    with LiveServer(mode="inline", config=ServerConfig(port=0, write_timeout_s=1.0)) as server:
        host, port = server.url.removeprefix("http://").split(":")
        body = json.dumps({"model": "omni-demo", "modalities": ["text", "audio"],
                           "audio": {"voice": "tone", "format": "wav"}, "messages": [{"role": "user", "content": "talk"}],
                           "stage_sampling": {"generator": {"max_tokens": 3000}}}).encode()
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((host, int(port)))
        try:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            connections = lambda: server.servers[0].runner.server.connections  # noqa: E731 (a new list each time)
            deadline = time.monotonic() + 30
            while server.state().inflight == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert server.state().inflight == 1 and connections()
            t0 = time.monotonic()
            while connections() and time.monotonic() - t0 < 15:
                time.sleep(0.1)
            assert not connections(), [c.transport.get_write_buffer_size() for c in connections() if c.transport]
            assert server.state().inflight == 0 and server.state().budgets["output"].used == 0
        finally:
            s.close()


def test_a_whole_answer_is_written_in_full_to_a_client_that_reads():
    import requests

    with LiveServer(mode="inline", config=ServerConfig(port=0, write_timeout_s=5.0)) as server:
        resp = requests.post(server.url + "/v1/chat/completions", timeout=60, json={
            "model": "omni-demo", "modalities": ["text", "audio"], "audio": {"voice": "tone", "format": "wav"},
            "messages": [{"role": "user", "content": "talk"}], "stage_sampling": {"generator": {"max_tokens": 600}}})
        assert resp.status_code == 200 and int(resp.headers["Content-Length"]) == len(resp.content) > 64 << 10
        assert resp.headers["Content-Type"].startswith("application/json")
        audio = base64.b64decode(resp.json()["choices"][0]["message"]["audio"]["data"])
        assert audio[:4] == b"RIFF" and len(audio) > 64 << 10
        assert server.state().budgets["output"].used == 0
