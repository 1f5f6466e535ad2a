"""Connections a client cannot hold hostage: header, body and write timeouts, OpenAI-shaped protocol errors.

aiohttp closes a connection that has not sent a whole request head within `keepalive_timeout` of
opening (or of its last response), whatever trickles in meanwhile: that is the header timeout. The
body is read by the routes, each under `read_body`'s timeout, and held on the server's `uploads`
budget until the request ends; streamed answers are written under `client_output`'s rule, so a
client that stops reading is cut off too. Errors aiohttp answers itself, before
any middleware runs (a malformed request line, a header over 8 KB), get the OpenAI error body too.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from omni.api.errors import ApiError, bad_request, error_response, too_large
from omni.api.state import STATE

log = logging.getLogger("omni.api")
LINGER_S = 1.0


class _JsonErrorHandler(RequestHandler):
    """aiohttp's per-connection protocol, rendering its own refusals as OpenAI error bodies."""

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0 and isinstance(exc, ConnectionError):
            # the client left (or was cut off) mid-response, e.g. on a stream's error event after a
            # stage died: one line, not aiohttp's traceback, and the connection ends as aiohttp ends it
            log.info("%s %s: the connection ended mid-response: %s", request.method, request.path, exc)
            raise ConnectionError("the response was under way; the connection is gone")
        if request.writer.output_size > 0:  # a response is under way: aiohttp cuts the connection
            return super().handle_error(request, status, exc, message)
        if isinstance(exc, LineTooLong):
            err = ApiError(431, f"request header fields too large: {message or exc}", code="header_too_large")
        elif status >= 500:
            self.log_exception("Error handling request", exc_info=exc)
            err = ApiError(500, "internal error", code="internal")
        else:
            err = ApiError(status, f"malformed HTTP request: {message or exc}", code="bad_http_request")
        response = error_response(err)
        response.force_close()
        return response


class _JsonErrorServer(Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, **self._kwargs)


class GuardedRunner(web.AppRunner):
    """An AppRunner whose connections use `_JsonErrorHandler`; `header_timeout_s` bounds the request head."""

    def __init__(self, app: web.Application, header_timeout_s: float, shutdown_timeout_s: float, **kwargs: Any) -> None:
        # lingering: after an answer sent before the body was read, what still trickles in is
        # read and ignored for at most this long (aiohttp's default is 10 s)
        super().__init__(app, keepalive_timeout=header_timeout_s, shutdown_timeout=shutdown_timeout_s,
                         lingering_time=LINGER_S, **kwargs)

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = _JsonErrorServer  # same state, our protocol class (aiohttp has no hook for it)
        return server


UPLOAD = web.RequestKey("omni_upload_lease", object)


def upload_lease(request: web.Request, nbytes: int) -> None:
    """Hold `nbytes` of this request's body on the server's `uploads` budget until the request ends
    (a 429 when every upload together would pass it, before a byte more is read)."""
    if UPLOAD not in request:
        request[UPLOAD] = request.app[STATE].budgets["uploads"].lease()
    request[UPLOAD].resize(nbytes)


def release_upload(request: web.Request) -> None:
    if UPLOAD in request:
        request[UPLOAD].close()


async def read_body(request: web.Request) -> bytes:
    """The whole body, or a 408 when it has not arrived within the server's body timeout. A body of
    a known length is held on the `uploads` budget before it is read; a chunked one as it arrives,
    so that the total holds for clients that send no Content-Length too."""
    if request.content_length is not None:
        upload_lease(request, request.content_length)
        body = await within_body_timeout(request, request.read())
    else:
        body = await within_body_timeout(request, _read_counted(request))
    upload_lease(request, len(body))
    return body


async def _read_counted(request: web.Request) -> bytes:
    limit = request.app[STATE].config.max_body_bytes
    body = bytearray()
    async for chunk in request.content.iter_chunked(64 << 10):
        body += chunk
        if len(body) > limit:
            raise too_large(f"request body too large: over {limit} bytes")
        upload_lease(request, len(body))
    data = bytes(body)
    request._read_bytes = data  # what request.read() returns from now on (aiohttp keeps the body there)
    return data


async def within_body_timeout(request: web.Request, reading):
    """Await `reading` (a coroutine that reads the body) under the body timeout: a 408 past it."""
    timeout_s = request.app[STATE].config.body_timeout_s
    try:
        return await asyncio.wait_for(reading, timeout_s)
    except asyncio.TimeoutError:
        err = ApiError(408, f"the request body did not arrive within {timeout_s:g} s", code="body_timeout")
        raise err from None



MAX_FIELD_BYTES = 64 << 10  # a multipart field that is not the file


async def read_form(request: web.Request, max_file_bytes: int, file_fields: tuple[str, ...] = ("file",)
                     ) -> tuple[dict[str, str | list[str]], bytes | None]:
    """The multipart fields (an `x[]` field may repeat: its values are a list) and the file (the
    first of `file_fields` present)."""
    if not request.content_type.startswith("multipart/"):
        raise bad_request(f"expected multipart/form-data, got {request.content_type!r}", code="invalid_content_type")
    fields: dict[str, str] = {}
    audio: bytes | None = None
    upload_lease(request, request.content_length or 0)
    received = 0
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if getattr(part, "name", None) is None:
                continue
            limit = max_file_bytes if part.name in file_fields else MAX_FIELD_BYTES
            data = bytearray()
            while chunk := await part.read_chunk(64 << 10):
                data += chunk
                received += len(chunk)
                if len(data) > limit:
                    raise too_large(f"form field {part.name!r} is over {limit} bytes", part.name)
                if received > (request.content_length or 0):  # chunked: held as it arrives
                    upload_lease(request, received)
            if part.name in file_fields:
                audio = bytes(data) if audio is None else audio
            elif part.name.endswith("[]"):
                fields.setdefault(part.name, []).append(data.decode("utf-8", errors="replace"))
            else:
                fields[part.name] = data.decode("utf-8", errors="replace")
    except ApiError:
        raise
    except Exception as exc:  # aiohttp raises assorted types (InvalidHeader, ValueError...) for a bad body
        raise bad_request(f"malformed multipart body: {exc}", code="invalid_multipart") from None
    upload_lease(request, sum(len(v) for v in fields.values()) + len(audio or b""))
    return fields, audio
