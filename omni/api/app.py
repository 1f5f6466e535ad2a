"""The aiohttp application: one ServerState (state.py: kernel, model info, config, metrics), routes,
middlewares.

Middleware order, outermost first: metrics (sees every final status), errors (renders refusals as
OpenAI bodies), auth (/v1/*, and /metrics unless `public_metrics`), admission (counts in-flight
requests for the drain; refuses new ones while draining, and past capacity before any body is read
or media decoded; gives a request's upload and queued output back to their budgets when it ends).
"""

from __future__ import annotations

import hmac
from typing import Any

from aiohttp import web

from omni.api import playground, routes_audio, routes_chat, routes_completions, routes_info, routes_transcribe, routes_voices
from omni.api.client_output import close_output, is_large_whole, send_whole
from omni.api.connections import release_upload
from omni.api.cors import install_cors
from omni.api.errors import ApiError, error_middleware
from omni.api.metrics import route_label
from omni.api.realtime import route as realtime
from omni.api.state import STATE, ServedModel, ServerConfig, ServerState
from omni.models.registry import ModelInfo


_OPEN_PATHS = ("/health", "/metrics", "/openapi.json")


@web.middleware
async def metrics_middleware(request: web.Request, handler):
    state = request.app[STATE]
    status = "499"  # a handler cancelled by a client that went away
    try:
        response = await handler(request)
        status = str(response.status)
        return response
    except web.HTTPException as exc:
        status = str(exc.status)
        raise
    except ConnectionResetError:
        raise
    except Exception:
        status = "500"
        raise
    finally:
        state.metrics.requests.labels(route_label(request), status).inc()


@web.middleware
async def auth_middleware(request: web.Request, handler):
    config = request.app[STATE].config
    key = config.api_key
    if key and (request.path.startswith("/v1/") or (request.path == "/metrics" and not config.public_metrics)):
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if request.path == realtime.ROUTE and realtime.protocol_key(request) is not None:  # browsers: no headers
            scheme, given = "bearer", realtime.protocol_key(request)
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
            raise ApiError(401, "missing or invalid API key; send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")
    return await handler(request)


@web.middleware
async def admission_middleware(request: web.Request, handler):
    state = request.app[STATE]
    if request.path in _OPEN_PATHS or request.method == "GET":
        return await handler(request)
    if state.draining:
        raise ApiError(503, "server is shutting down; not accepting new requests", code="shutting_down")
    limit = state.config.max_concurrent or getattr(state.kernel, "max_inflight", None)
    if limit and state.inflight >= limit:  # before the body is read or its media decoded
        raise ApiError(429, f"server is at capacity ({state.inflight} requests in flight), retry later",
                       code="overloaded")
    state.inflight += 1
    try:
        response = await handler(request)
        if is_large_whole(response):  # a whole answer too goes out under the slow-client rule
            return await send_whole(request, response)
        return response
    finally:
        release_upload(request)
        close_output(request)
        state._left()


def build_app(kernel: Any, info: ModelInfo, stage_names: list[str], config: ServerConfig | None = None,
              extra_models: list[ServedModel] | None = None) -> web.Application:
    """The whole API for one served model (plus `extra_models` beside it), ready for an AppRunner."""
    config = config or ServerConfig()
    app = web.Application(client_max_size=config.max_body_bytes,
                          middlewares=[metrics_middleware, error_middleware, auth_middleware,
                                       admission_middleware])
    if config.allowed_origins:
        install_cors(app, config.allowed_origins)
    state = app[STATE] = ServerState(kernel, info, list(stage_names), config, extra_models=list(extra_models or ()))
    state.voices = routes_voices.open_store(info, config, state.budgets["voice_cache"])
    app.router.add_post(routes_chat.ROUTE, routes_chat.chat_completions)
    routes_completions.install(app)
    app.router.add_post(routes_audio.SPEECH_ROUTE, routes_audio.speech)
    app.router.add_post(routes_transcribe.TRANSCRIBE_ROUTE, routes_transcribe.transcriptions)
    app.router.add_post(routes_transcribe.TRANSLATE_ROUTE, routes_transcribe.translations)
    routes_voices.install(app)
    app.router.add_get("/v1/models", routes_info.list_models)
    app.router.add_get("/v1/models/{model}", routes_info.get_model)
    app.router.add_get("/health", routes_info.health)
    app.router.add_get("/metrics", routes_info.metrics)
    app.router.add_get("/openapi.json", routes_info.openapi)
    realtime.install(app)
    playground.install(app)
    return app
