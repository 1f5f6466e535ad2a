"""The API's state kept in the aiohttp app (`app[STATE]`): the served models, their kernels, the
operator's settings, metrics and the drain count. Routes read it from here, not from the app module
(which imports the routes)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from omni.api.aliases import CHAT, OPENAI_ALIASES, SPEECH, TRANSCRIBE, TRANSLATE, alias_task, chats, translates
from omni.api.budgets import Budgets, default_limits
from omni.api.media import MediaLimits
from omni.api.metrics import ApiMetrics
from omni.models.registry import ModelInfo


@dataclass
class ServerConfig:
    """Everything the operator sets for the HTTP side (the graph's own settings live in the Graph)."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_body_bytes: int = 64 << 20
    limits: MediaLimits = field(default_factory=MediaLimits)
    request_timeout_s: float | None = None  # passed to the kernel as each request's deadline
    drain_timeout_s: float = 30.0  # SIGTERM to exit, whatever the clients do
    header_timeout_s: float = 10.0  # a connection's request head must arrive within this (also keep-alive idle)
    body_timeout_s: float = 60.0  # a request's whole body must arrive within this
    write_timeout_s: float = 60.0  # a client (HTTP stream or WebSocket) must take in output at least this often
    max_queued_output_bytes: int = 8 << 20  # output one connection may leave unread (past it: cut off)
    budgets: dict[str, int] = field(default_factory=default_limits)  # total bytes per resource (budgets.py)
    public_metrics: bool = False  # with api_key: /metrics stays open (it names stage PIDs and traffic)
    max_concurrent: int | None = None  # POSTs admitted at once (429 beyond); None: the kernel's max_inflight
    max_realtime_sessions: int = 256  # Realtime sockets open at once; more get an `overloaded` error event
    probe_timeout_s: float = 1.0
    model_aliases: list[str] = field(default_factory=list)  # extra names clients may use for the model
    allowed_origins: list[str] = field(default_factory=list)  # CORS: origins browsers may call from ("*": any)
    voice_dir: str | None = None  # uploaded voices (models that clone voices); omnid: <cache dir>/voices,
    # None: a temporary directory (not kept)
    voice_cache_bytes: int = 256 << 20  # their total size on disk; past it the least recently used go
    voice_max_seconds: float = 60.0  # longest reference clip taken


@dataclass
class ServedModel:
    """A model served beside the main one, on its own kernel (e.g. a Whisper next to an omni model)."""

    kernel: Any
    info: ModelInfo
    stage_names: list[str]


@dataclass
class ServerState:
    kernel: Any  # the main model's: chat and speech go here
    info: ModelInfo
    stage_names: list[str]
    config: ServerConfig
    metrics: ApiMetrics = field(default_factory=ApiMetrics)
    started_at: int = field(default_factory=lambda: int(time.time()))
    inflight: int = 0
    draining: bool = False
    _idle: asyncio.Event | None = None
    extra_models: list[ServedModel] = field(default_factory=list)
    voices: Any = None  # the VoiceStore of a model that clones voices
    budgets: Budgets = None  # every client's data in total (budgets.py); made from config.budgets

    def __post_init__(self) -> None:
        limits = {**default_limits(), **self.config.budgets, "voice_cache": self.config.voice_cache_bytes}
        self.budgets = self.budgets or Budgets(limits)
        self.metrics.watch_budgets(self.budgets)

    def model_names(self) -> list[str]:
        """Every name a client may use: the served models, operator aliases, then those OpenAI names
        (`whisper-1`, `tts-1`, `gpt-4o`...) whose task a served model does."""
        own = [self.info.id, *self.config.model_aliases, *(m.info.id for m in self.extra_models)]
        return own + [a for a in OPENAI_ALIASES if a not in own and self._alias_target(a) is not None]

    def served(self) -> list[ServedModel]:
        """Every served model, the main one first."""
        return [ServedModel(self.kernel, self.info, self.stage_names), *self.extra_models]

    def model_info(self, name: str) -> ModelInfo | None:
        if name in (self.info.id, *self.config.model_aliases):
            return self.info
        found = next((m.info for m in self.extra_models if m.info.id == name), None)
        return found or self._alias_target(name)

    def _alias_target(self, name: str) -> ModelInfo | None:
        """The served model an OpenAI name stands for (None: not such a name, or no model does its task)."""
        task = alias_task(name)
        if task == CHAT:
            return self.info if chats(self.info) else None
        if task == SPEECH:
            return self.info if self.info.speaks else None
        if task == TRANSCRIBE:  # never a random-weight model: its transcripts are noise
            found = self._transcriber_for(None)
            return found.info if found and not found.info.random_weights else None
        return None

    def transcriber(self, name: str, task: str = TRANSCRIBE) -> ServedModel | None:
        """Who serves a transcription (or translation) asked of model `name`: that model when it
        does it with trained weights, else the first served model that does, else any that does it
        at all (a random-weight model's transcripts are noise). None when no model does."""
        return self._transcriber_for(self.model_info(name), task)

    def _transcriber_for(self, info: ModelInfo | None, task: str = TRANSCRIBE) -> ServedModel | None:
        models = self.served()
        named = [m for m in models if m.info is info]
        able = [m for m in named + models if (translates(m.info) if task == TRANSLATE else m.info.transcribes)]
        return ([m for m in able if not m.info.random_weights] or able or [None])[0]

    def who_serves(self) -> list[str]:
        """One line per task: which served model answers it, and under which of OpenAI's names (the
        start-up log says so, so that nobody mistakes a random model's output for a real one's)."""
        found = self._transcriber_for(None)
        doers = {"chat (/v1/chat/completions, /v1/completions, /v1/realtime)": (CHAT, self.info if chats(self.info) else None),
                 "speech (/v1/audio/speech)": (SPEECH, self.info if self.info.speaks else None),
                 "transcription (/v1/audio/transcriptions)": (TRANSCRIBE, found.info if found else None)}
        lines = []
        for what, (task, doer) in doers.items():
            if doer is None:
                lines.append(f"{what}: not served")
                continue
            names = [a for a in OPENAI_ALIASES if alias_task(a) == task and self._alias_target(a) is doer]
            lines.append(f"{what}: {doer.id!r}" + (" (RANDOM weights: noise)" if doer.random_weights else "")
                         + (f", also as {', '.join(names)}" if names else ", under no OpenAI name"))
        return lines

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight; False when the timeout passed first."""
        if self.inflight == 0:
            return True
        self._idle = self._idle or asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    def _left(self) -> None:
        self.inflight -= 1
        if self.inflight == 0 and self._idle is not None:
            self._idle.set()


STATE = web.AppKey("omni_state", ServerState)
