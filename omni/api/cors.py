"""CORS for browser clients (`omnid serve --allowed-origins`), as vLLM's `--allowed-origins` does.

Headers are added as each response is prepared (streamed answers too: their headers leave before
the body); a preflight (OPTIONS with Access-Control-Request-Method) is answered here, before the
API key check, as browsers send preflights without credentials.
"""

from __future__ import annotations

from aiohttp import web

ALLOW_HEADERS = "Authorization, Content-Type, OpenAI-Organization, OpenAI-Project, OpenAI-Beta, X-Stainless-*"
MAX_AGE_S = 600


def _allowed(origins: list[str], origin: str | None) -> str | None:
    """The Access-Control-Allow-Origin value for `origin`, or None when it may not call."""
    if not origin:
        return None
    if "*" in origins:
        return "*"
    return origin if origin in origins else None


def install_cors(app: web.Application, origins: list[str]) -> None:
    """Answer preflights and label every response for the `origins` ('*': any)."""

    async def label(request: web.Request, response: web.StreamResponse) -> None:
        allow = _allowed(origins, request.headers.get("Origin"))
        if allow is not None:
            response.headers["Access-Control-Allow-Origin"] = allow
            response.headers["Access-Control-Expose-Headers"] = "*"
            if allow != "*":
                response.headers["Vary"] = "Origin"

    @web.middleware
    async def preflight(request: web.Request, handler):
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            if _allowed(origins, request.headers.get("Origin")) is None:
                return web.Response(status=403, text="origin not allowed")
            return web.Response(status=204, headers={
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                "Access-Control-Allow-Headers": request.headers.get("Access-Control-Request-Headers") or ALLOW_HEADERS,
                "Access-Control-Max-Age": str(MAX_AGE_S)})
        return await handler(request)

    app.middlewares.insert(0, preflight)
    app.on_response_prepare.append(label)
