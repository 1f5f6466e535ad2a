"""Shared by the API tests (no tests here): a live omnid app on a free loopback port, run in a
background thread with its own event loop, so the official synchronous `openai` client can call it.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np

from background_loop import BackgroundLoop
from omni.api.app import STATE, ServerConfig, build_app
from omni.api.server import HttpServer
from omni.kernel.kernel import Kernel
from omni.models.demo.graph import build_demo


class LiveServer(BackgroundLoop):
    """`with LiveServer(...) as srv:` -> srv.url, srv.kernel, srv.run(coro) on the server's loop."""

    def __init__(self, mode: str = "inline", max_inflight: int = 64, config: ServerConfig | None = None,
                 stage_args: dict[str, dict[str, Any]] | None = None, info_changes: dict | None = None,
                 extra_configs: list[ServerConfig] = (), spec_changes: dict[str, dict[str, Any]] | None = None,
                 build=build_demo, env: dict[str, str] | None = None) -> None:
        self.mode, self.max_inflight = mode, max_inflight
        self.build, self.env = build, env  # build() -> (Graph, ModelInfo): the demo, or a family's tiny graph
        self.config = config or ServerConfig(port=0)
        self.stage_args = stage_args or {}
        self.info_changes = info_changes or {}
        self.extra_configs = list(extra_configs)
        self.spec_changes = spec_changes or {}  # {stage: {StageSpec field: value}}
        self.servers: list[HttpServer] = []
        super().__init__()

    async def _start(self) -> None:
        graph, info = self.build()
        for stage, args in self.stage_args.items():
            graph.stage(stage).args.update(args)
        for stage, fields in self.spec_changes.items():
            for name, value in fields.items():
                setattr(graph.stage(stage), name, value)
        for key, value in self.info_changes.items():
            setattr(info, key, value)
        self.info = info
        self.kernel = Kernel(graph, mode=self.mode, max_inflight=self.max_inflight,
                             **({"env": dict(self.env)} if self.env else {}))
        await self.kernel.start()
        for config in [self.config, *self.extra_configs]:
            app = build_app(self.kernel, info, [s.name for s in graph.stages], config)
            self.servers.append(await HttpServer(app, "127.0.0.1", 0).start())

    async def _stop(self) -> None:
        for server in self.servers:
            await server.stop()
        await self.kernel.stop()

    @property
    def url(self) -> str:
        return self.servers[0].url

    def state(self, index: int = 0):
        return self.servers[index].app[STATE]



def wav_bytes(seconds: float = 0.5, rate: int = 24000, fmt: str = "WAV") -> bytes:
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate, format=fmt)
    return buf.getvalue()


def png_data_url(size: int = 4) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), (200, 10, 10)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def av_bytes(pcm: np.ndarray, rate: int, container: str, codec: str) -> bytes:
    """Mono float32 encoded with PyAV as a browser or phone would send it (webm/opus, m4a/aac...)."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(np.asarray(pcm, np.float32).reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate, frame.pts = rate, 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buf.getvalue()
