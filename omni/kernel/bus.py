"""The control bus's two ends: an inbound mailbox and outbound peer sockets.

Both use plain (sync) zmq sockets driven from the event loop: the mailbox drains its PULL
socket from a reader callback on the socket's FD (no future per message), and sends never
block: a peer that is gone (no pipe) makes `send` return False and the message is dropped,
which is right, since the supervisor fails whatever that peer held. This halves the per-hop
cost of zmq.asyncio's awaitable sockets.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

import msgspec
import zmq

from omni.kernel import messages as m

log = logging.getLogger("omni.bus")


class Mailbox:
    """One bound PULL socket; `handler(msg, extra_frames)` runs on the loop for every message. A
    malformed message, or one the handler raises on, is dropped (and counted)."""

    def __init__(self, address: str, handler: Callable[[m.AnyMsg, list[Any]], None], name: str) -> None:
        self.name = name
        self.dropped = 0
        self.sock = zmq.Context.instance().socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.bind(address)
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)  # tcp://host:* -> the port it got
        self._handler = handler
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.sock.getsockopt(zmq.FD), self._drain)
        self._loop.call_soon(self._drain)  # messages that arrived before the reader was set

    def _drain(self) -> None:
        sock = self.sock
        while not sock.closed:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.ZMQError:  # zmq.Again: nothing more to read now
                return
            try:
                self._handler(m.decode(frames[0].buffer), frames[1:])
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                self.dropped += 1
                log.warning("%s dropped a malformed message: %s", self.name, exc)
            except Exception:
                self.dropped += 1
                log.exception("%s failed to handle a message; dropped", self.name)

    def close(self) -> None:
        if self._loop is not None and not self.sock.closed:
            try:
                self._loop.remove_reader(self.sock.getsockopt(zmq.FD))
            except (ValueError, zmq.ZMQError, RuntimeError):
                pass
        self.sock.close(linger=0)


class Outbox:
    """PUSH sockets to named peers, connected on first use; sends never block."""

    def __init__(self, address_of: Callable[[str], str], name: str) -> None:
        self.name = name
        self._address_of = address_of
        self._peers: dict[str, zmq.Socket] = {}

    def _socket(self, peer: str) -> zmq.Socket:
        sock = self._peers.get(peer)
        if sock is None:
            sock = zmq.Context.instance().socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)  # bounded by credits and admission, not by zmq
            sock.connect(self._address_of(peer))
            self._peers[peer] = sock
        return sock

    def send(self, peer: str, msg: m.Msg, frames: list[Any] | None = None) -> bool:
        try:
            self._socket(peer).send_multipart([m.encode(msg), *(frames or [])], zmq.NOBLOCK, copy=False)
            return True
        except zmq.ZMQError as exc:  # zmq.Again: no pipe to the peer, it is gone
            log.warning("%s dropped a %s for %s: %s", self.name, type(msg).__name__, peer, exc)
            return False

    def reset(self, peer: str) -> None:
        """Forget a peer's socket (and what was queued for it); the next send reconnects."""
        sock = self._peers.pop(peer, None)
        if sock is not None:
            sock.close(linger=0)

    def close(self) -> None:
        for sock in self._peers.values():
            sock.close(linger=0)
        self._peers.clear()
