"""GET /v1/realtime: the WebSocket of OpenAI's Realtime API (`?model=` names the model).

Two dialects, as OpenAI serves them: a client that sends `OpenAI-Beta: realtime=v1` (the `openai`
client's `beta.realtime`) gets the beta event names (`response.audio.delta`...), any other (the GA
`realtime` client, browsers) the GA names (`response.output_audio.delta`...). Browsers cannot set
headers: they may send the API key as the subprotocol `openai-insecure-api-key.<key>`, as with
OpenAI. A dropped socket cancels its response in every stage and frees the session; at shutdown
every socket gets an `error` event (code `shutting_down`), then is closed with 1001 (going away).
Past `--max-realtime-sessions` open sockets, a new one gets one `error` event (429 `overloaded`) and
close code 1013 (try again later): the open sessions keep their pace.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
from aiohttp import WSMsgType, web

from omni.api.client_output import ClientOutput
from omni.api.errors import ApiError
from omni.api.params import check_model
from omni.api.realtime.response import error_event
from omni.api.realtime.session import RealtimeSession
from omni.api.state import STATE

log = logging.getLogger("omni.api")
ROUTE = "/v1/realtime"
KEY_PROTOCOL = "openai-insecure-api-key."
MAX_EVENT_BYTES = 16 << 20  # OpenAI's limit on one client event is 15 MiB
GOING_AWAY_S = 2.0  # at shutdown, for a socket's error event and close handshake
TRY_AGAIN_LATER = 1013  # the WebSocket close code of a server at capacity (RFC 6455 registry)
SOCKETS = web.AppKey("omni_realtime_sockets", set)  # the open sockets' outboxes
_GA_NAMES = {
    "response.text.delta": "response.output_text.delta",
    "response.text.done": "response.output_text.done",
    "response.audio.delta": "response.output_audio.delta",
    "response.audio.done": "response.output_audio.done",
    "response.audio_transcript.delta": "response.output_audio_transcript.delta",
    "response.audio_transcript.done": "response.output_audio_transcript.done",
    "conversation.item.created": "conversation.item.added",
}
_encode = msgspec.json.Encoder().encode


def protocol_key(request: web.Request) -> str | None:
    """The API key a browser sent as a subprotocol, if any."""
    for proto in request.headers.get("Sec-WebSocket-Protocol", "").split(","):
        proto = proto.strip()
        if proto.startswith(KEY_PROTOCOL):
            return proto[len(KEY_PROTOCOL):]
    return None


class Outbox:
    """Serialised sends of one socket, each event stamped with an id and named in its dialect and
    written under the slow-client rule (client_output.py: a client that does not read is cut off);
    after the socket closes or is cut off, sends are dropped."""

    def __init__(self, ws: web.WebSocketResponse, output: ClientOutput, beta: bool) -> None:
        self.ws, self.output, self.beta = ws, output, beta
        self._lock = asyncio.Lock()
        self._count = 0

    async def send(self, event: dict) -> None:
        if self.ws.closed or self.output.cut_reason is not None:
            return
        self._count += 1
        kind = event["type"]
        event = {"type": kind if self.beta else _GA_NAMES.get(kind, kind), "event_id": f"event_{self._count}",
                 **{k: v for k, v in event.items() if k != "type"}}
        data = _encode(event).decode()
        try:
            await self.output.write(len(data), lambda: self._send(data))
        except (ConnectionResetError, RuntimeError):  # cut off, or closing under us: the reader sees it too
            pass

    async def _send(self, data: str) -> None:
        async with self._lock:
            await self.ws.send_str(data)

    async def going_away(self, err: ApiError) -> None:
        """The server stops: an `error` event saying why, then close code 1001 (going away); a
        client that takes neither within GOING_AWAY_S is cut off (the drain's time is bounded)."""
        async def farewell() -> None:
            await self.send(error_event(err))
            await self.ws.close(code=1001, message=b"server shutting down")

        try:
            await asyncio.wait_for(farewell(), GOING_AWAY_S)
        except asyncio.TimeoutError:
            if self.output.transport is not None:
                self.output.transport.abort()


async def realtime(request: web.Request) -> web.WebSocketResponse:
    state = request.app[STATE]
    if state.draining:
        raise ApiError(503, "server is shutting down; not accepting new sessions", code="shutting_down")
    model = request.query.get("model") or state.info.id
    check_model(state, model, chat=True)
    ws = web.WebSocketResponse(protocols=("realtime",), max_msg_size=MAX_EVENT_BYTES, heartbeat=30.0)
    if not ws.can_prepare(request).ok:
        raise ApiError(400, "this is a WebSocket endpoint: connect with an Upgrade: websocket request",
                       code="websocket_required")
    await ws.prepare(request)
    beta = "realtime=v1" in request.headers.get("OpenAI-Beta", "")
    outbox = Outbox(ws, ClientOutput(request), beta)
    if len(request.app[SOCKETS]) >= state.config.max_realtime_sessions:  # no await from here to add: no race
        await refuse_full(outbox, state.config.max_realtime_sessions)
        return ws
    session = RealtimeSession(state, outbox.send, model, beta)
    request.app[SOCKETS].add(outbox)
    try:
        await session.start()
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                await session.handle(msg.data)
            elif msg.type == WSMsgType.BINARY:
                await session.handle(msg.data)  # JSON in a binary frame reads the same
            elif msg.type == WSMsgType.ERROR:
                break
    finally:  # what needs no await first: a disconnect cancels this handler, maybe again in the await
        request.app[SOCKETS].discard(outbox)
        outbox.output.close()
        await asyncio.shield(session.close())
    return ws


async def refuse_full(outbox: Outbox, capacity: int) -> None:
    """Past capacity a new session is refused, the open ones keep their pace: the refusal is the
    socket's first event (a client library shows an event; an HTTP 429 before the upgrade reads as
    a failed handshake), then close code 1013 (try again later)."""
    err = ApiError(429, f"the server is at its capacity of {capacity} Realtime sessions; retry later or "
                   "connect to another instance", code="overloaded")
    try:
        await asyncio.wait_for(outbox.send(error_event(err)), GOING_AWAY_S)
        await outbox.ws.close(code=TRY_AGAIN_LATER, message=b"at capacity")
    except asyncio.TimeoutError:
        pass
    finally:
        outbox.output.close()


async def _close_sockets(app: web.Application) -> None:
    err = ApiError(503, "the server is shutting down; reconnect to another instance or later", code="shutting_down")
    await asyncio.gather(*(outbox.going_away(err) for outbox in list(app[SOCKETS])), return_exceptions=True)


def install(app: web.Application) -> None:
    app[SOCKETS] = set()
    app.router.add_get(ROUTE, realtime)
    app.on_shutdown.append(_close_sockets)
