"""The one rule for clients that stop reading, the same for HTTP streams, whole HTTP answers and
WebSockets: each write
must be taken in within `write_timeout_s`, and one connection may leave at most
`max_queued_output_bytes` unread (what waits to be written plus the transport's buffer). Past
either the connection is cut off: its handler ends, so its request is cancelled in every stage.

What a connection leaves queued counts against the server's total `output` budget too; a
connection that would take the budget past its limit is cut off the same way (the clients that do
read are served meanwhile).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from omni.api.errors import ApiError
from omni.api.state import STATE

log = logging.getLogger("omni.api")
OUTPUT = web.RequestKey("omni_client_output", object)


class ClientOutput:
    """Every write to one client connection goes through `write`; `close` when the handler ends."""

    def __init__(self, request: web.Request) -> None:
        state = request.app[STATE]
        self.transport = request.transport
        self.timeout_s = state.config.write_timeout_s
        self.max_bytes = state.config.max_queued_output_bytes
        self.lease = state.budgets["output"].lease()
        self.waiting = 0  # bytes handed to `write` and not yet taken by the transport
        self.cut_reason: str | None = None

    @classmethod
    def of(cls, request: web.Request) -> ClientOutput:
        """The request's one ClientOutput (made on its first write)."""
        if OUTPUT not in request:
            request[OUTPUT] = cls(request)
        return request[OUTPUT]

    def queued(self) -> int:
        transport = self.transport
        buffered = transport.get_write_buffer_size() if transport is not None and not transport.is_closing() else 0
        return self.waiting + buffered

    async def write(self, nbytes: int, send: Callable[[], Awaitable[None]]) -> None:
        """Run `send()` (which writes `nbytes`) under the rule; a ConnectionResetError once cut off."""
        if self.cut_reason is not None:
            raise ConnectionResetError(self.cut_reason)
        self.waiting += nbytes
        try:
            queued = self.queued()
            if queued > self.max_bytes:
                self._cut(f"the client left {queued} bytes unread (the limit is {self.max_bytes})")
            try:
                self.lease.resize(queued)
            except ApiError as err:
                self._cut(err.message)
            try:  # asyncio.timeout, not wait_for: wait_for (3.11) loses a cancel that lands as send() ends
                async with asyncio.timeout(self.timeout_s):
                    await send()
            except TimeoutError:
                self._cut(f"the client read nothing for {self.timeout_s:g} s")
        finally:
            self.waiting -= nbytes
            if self.cut_reason is None:
                self.lease.settle(self.queued())

    def _cut(self, reason: str) -> None:
        self.cut_reason = reason
        log.info("cutting off a client that does not read: %s", reason)
        if self.transport is not None:
            self.transport.abort()
        self.lease.close()
        raise ConnectionResetError(reason)

    def close(self) -> None:
        self.lease.close()


async def write_stream(request: web.Request, response: web.StreamResponse, data: bytes) -> None:
    """One piece of a streamed HTTP answer, under the rule."""
    await ClientOutput.of(request).write(len(data), lambda: response.write(data))


def close_output(request: web.Request) -> None:
    """Give the request's queued output back to the budget (the handler has ended)."""
    if OUTPUT in request:
        request[OUTPUT].close()


WHOLE_CHUNK = 64 << 10  # what aiohttp buffers without waiting for the client (its StreamWriter's limit)


async def send_whole(request: web.Request, response: web.Response) -> web.StreamResponse:
    """A whole (not streamed) answer written under the rule, in pieces: aiohttp would write it after
    the handler ends and wait for a client that never reads forever, its bytes held and uncounted."""
    body = bytes(response.body)
    stream = web.StreamResponse(status=response.status, reason=response.reason, headers=response.headers)
    stream.content_length = len(body)
    await stream.prepare(request)
    for start in range(0, len(body), WHOLE_CHUNK):
        await write_stream(request, stream, body[start:start + WHOLE_CHUNK])
    await stream.write_eof()
    return stream


def is_large_whole(response) -> bool:
    """A plain answer with a body past what aiohttp buffers without waiting."""
    return (type(response) is web.Response and isinstance(response.body, (bytes, bytearray))
            and len(response.body) > WHOLE_CHUNK)
