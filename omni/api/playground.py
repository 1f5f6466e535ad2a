"""The playground at `/`: plain static files (omni/api/static), served as they are, no build step."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC = Path(__file__).parent / "static"


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


def install(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_static("/static/", STATIC, append_version=False)
