"""GET routes: /v1/models, /health (every stage must answer a probe), /metrics, /openapi.json."""

from __future__ import annotations

import logging

import msgspec
from aiohttp import web

from omni.api.aliases import chats
from omni.api.errors import ApiError
from omni.api.metrics import CONTENT_TYPE
from omni.api.state import STATE

log = logging.getLogger("omni.api")


def _state(request: web.Request):
    return request.app[STATE]


def _model_card(state, name: str) -> dict:
    """A model's card; `transcribes` only where a transcription asked of this name is this model's
    own work (not a side model's), `root` the served model an alias stands for."""
    info = state.model_info(name) or state.info
    doer = state.transcriber(name)
    return {"id": name, "object": "model", "created": state.started_at, "owned_by": "omni", "root": info.id,
            "family": info.family, "speaks": info.speaks, "chats": chats(info),
            "transcribes": bool(info.transcribes and doer is not None and doer.info is info),
            "voices": list(info.voices), "random_weights": info.random_weights}


async def list_models(request: web.Request) -> web.Response:
    state = _state(request)
    return web.json_response({"object": "list", "data": [_model_card(state, n) for n in state.model_names()]})


async def get_model(request: web.Request) -> web.Response:
    state = _state(request)
    name = request.match_info["model"]
    if state.model_info(name) is None:
        raise ApiError(404, f"model {name!r} is not served here; served: {state.model_names()}", param="model",
                       code="model_not_found")
    return web.json_response(_model_card(state, name))


async def health(request: web.Request) -> web.Response:
    """200 when every core stage answers a probe, with `degraded` naming the capabilities a down
    stage takes away meanwhile (requests that do not need them are served); 503 names core stages
    that do not answer."""
    state = _state(request)
    try:
        probes, states, optional = {}, {}, {}
        for served in state.served():  # an extra model's stages are named "<model id>/<stage>"
            prefix = "" if served.kernel is state.kernel else f"{served.info.id}/"
            found = await served.kernel.probe(timeout_s=state.config.probe_timeout_s)
            probes.update({prefix + k: v for k, v in found.items()})
            states.update({prefix + k: v for k, v in served.kernel.health().items()})
            for cap, stages in served.kernel.capabilities().items():
                optional.update({prefix + s: prefix + cap for s in stages})
    except Exception as exc:  # a kernel that cannot even be asked is not healthy
        log.warning("health probe failed: %s: %s", type(exc).__name__, exc)
        raise ApiError(503, f"kernel did not answer the health probe: {type(exc).__name__}: {exc}",
                       code="unhealthy") from None
    silent = sorted(name for name, ok in probes.items() if not ok)
    down = [name for name in silent if name not in optional]
    degraded = sorted({optional[name] for name in silent if name in optional})
    if state.draining:
        raise ApiError(503, "server is shutting down", code="shutting_down")
    if down or not probes:
        detail = ", ".join(f"{n} ({states.get(n, 'no answer')})" for n in down) or "no stages"
        raise ApiError(503, f"stages not answering: {detail}", param=",".join(down) or None, code="unhealthy")
    return web.json_response({"status": "degraded" if degraded else "ok", "model": state.info.id,
                              "degraded": degraded, "stages": states})


async def metrics(request: web.Request) -> web.Response:
    state = _state(request)
    stats = {}
    for served in state.served():  # an extra model's stages are named "<model id>/<stage>"
        prefix = "" if served.kernel is state.kernel else f"{served.info.id}/"
        try:
            stats.update({prefix + k: v for k, v in (await served.kernel.stats()).items()})
        except Exception as exc:  # metrics stay readable when a kernel is in trouble
            log.warning("kernel.stats() of %s failed: %s: %s", served.info.id, type(exc).__name__, exc)
    body = state.metrics.render(stats)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def openapi(request: web.Request) -> web.Response:
    from omni.api.openapi import build_openapi

    state = _state(request)
    doc = build_openapi(voices=state.info.voices, models=state.model_names())
    return web.Response(body=msgspec.json.encode(doc), content_type="application/json")
