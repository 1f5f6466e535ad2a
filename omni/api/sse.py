"""Server-sent events on an aiohttp response: `data: <json>\\n\\n` frames, then `data: [DONE]` (after an
error event too)."""

from __future__ import annotations

import msgspec
from aiohttp import web

from omni.api.client_output import write_stream
from omni.api.errors import ApiError

_encode = msgspec.json.Encoder().encode


class SseStream:
    """Opened lazily so that errors before the first event can still be plain HTTP errors."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None

    @property
    def started(self) -> bool:
        return self.response is not None

    async def open(self) -> None:
        if self.response is None:
            self.response = web.StreamResponse(headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            })
            await self.response.prepare(self.request)

    async def send(self, payload: dict, event: str | None = None) -> None:
        await self.open()
        head = b"event: " + event.encode() + b"\n" if event else b""
        await write_stream(self.request, self.response, head + b"data: " + _encode(payload) + b"\n\n")

    async def fail(self, err: ApiError) -> web.StreamResponse:
        """A failure after the stream started (a dead stage, the server shutting down): an error
        event (the openai client raises on it), then `[DONE]`, so that no client mistakes the end
        for a network fault."""
        await self.send(err.body())
        return await self.done()

    async def done(self, marker: bool = True) -> web.StreamResponse:
        await self.open()
        if marker:
            await write_stream(self.request, self.response, b"data: [DONE]\n\n")
        await self.response.write_eof()
        return self.response
