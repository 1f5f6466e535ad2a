"""One kernel request as a route sees it: submit, read normalised pieces, and always clean up.

Whatever ends the handler (the last event, a stop string, an error, a client that disconnects and
cancels the handler task), a request that has not finished is cancelled in every stage.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np

from omni.api.metrics import RequestTimer

log = logging.getLogger("omni.api")


@dataclass
class TextPiece:
    text: str
    tokens: int
    segments: list[dict] | None = None  # a transcriber's timed segments for this text, when asked for
    language: str | None = None  # a transcriber's (detected) language
    logprobs: list[dict] | None = None  # OpenAI's logprobs.content entries of these tokens, when asked
    words: list[dict] | None = None  # a transcriber's timed words, when asked for
    token_ids: list[int] | None = None  # the ids generated (the stop token included): what the model saw


@dataclass
class AudioPiece:
    pcm: np.ndarray  # float32 mono, only the new samples
    sample_rate: int


@dataclass
class Finish:
    reason: str
    prompt_tokens: int
    completion_tokens: int


class StopMatcher:
    """Applies OpenAI `stop` strings to streamed text: holds back only what could begin a stop."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self._held = ""
        self.stopped = False

    def push(self, delta: str) -> str:
        if not self.stops or self.stopped:
            return "" if self.stopped else delta
        text = self._held + delta
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:n]):
                    keep = max(keep, n)
                    break
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


@dataclass
class Collected:
    text: list[str] = field(default_factory=list)
    audio: list[np.ndarray] = field(default_factory=list)
    sample_rate: int = 24000
    finish: Finish | None = None
    segments: list[dict] = field(default_factory=list)
    language: str | None = None
    logprobs: list[dict] = field(default_factory=list)
    words: list[dict] = field(default_factory=list)

    @property
    def pcm(self) -> np.ndarray:
        return np.concatenate(self.audio) if self.audio else np.zeros(0, np.float32)

    def add(self, piece: TextPiece | AudioPiece | Finish) -> None:
        if isinstance(piece, TextPiece):
            self.text.append(piece.text)
            self.segments.extend(piece.segments or ())
            self.language = piece.language or self.language
            self.logprobs.extend(piece.logprobs or ())
            self.words.extend(piece.words or ())
        elif isinstance(piece, AudioPiece):
            self.audio.append(piece.pcm)
            self.sample_rate = piece.sample_rate
        else:
            self.finish = piece


def _as_pcm(data) -> np.ndarray:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    return np.asarray(data, dtype=np.float32).reshape(-1)


class KernelRequest:
    """`async with KernelRequest(...) as req: async for piece in req.pieces(): ...`"""

    def __init__(self, kernel, params: dict, timer: RequestTimer, stops: list[str] | None = None,
                 deadline_s: float | None = None, audio: bool = True) -> None:
        self.kernel = kernel
        self.audio = audio  # False: the client asked for text only; audio the model makes is dropped
        self.params = params
        self.timer = timer
        self.deadline_s = deadline_s
        self.rid = "req-" + uuid.uuid4().hex[:16]
        self.stop = StopMatcher(stops or [])
        self.stream = None
        self.finished = False
        self.completion_tokens = 0

    async def __aenter__(self) -> KernelRequest:
        self.stream = self.kernel.submit(self.params, rid=self.rid, deadline_s=self.deadline_s)
        return self

    async def __aexit__(self, *exc_info) -> None:
        if not self.finished and self.stream is not None:
            self.finished = True
            task = asyncio.ensure_future(self._cancel())
            try:  # shielded: the handler itself may be being cancelled by a disconnect
                await asyncio.shield(task)
            except asyncio.CancelledError:
                pass

    async def _cancel(self) -> None:
        try:
            await self.stream.cancel()
        except Exception as exc:  # cancelling is best effort; the kernel reports its own failures
            log.warning("cancelling %s failed: %s: %s", self.rid, type(exc).__name__, exc)

    async def pieces(self) -> AsyncIterator[TextPiece | AudioPiece | Finish]:
        """Text (after stop strings), audio, and exactly one Finish at the end."""
        async for ev in self.stream:
            data = ev.data or {}
            if ev.final:
                self.finished = True
                tail = self.stop.flush()
                if tail:
                    yield TextPiece(tail, 0)
                yield self._finish(data.get("finish_reason") or "stop", data.get("usage") or {})
                return
            if ev.port == "text":
                tokens = len(data.get("token_ids") or ())
                self.completion_tokens += tokens
                text = self.stop.push(data.get("text") or "")
                if text or tokens:
                    self.timer.on_text()
                    yield TextPiece(text, tokens, data.get("segments"), data.get("language"), data.get("logprobs"),
                                    data.get("words"), data.get("token_ids"))
                if self.stop.stopped:
                    await self.stream.cancel()
                    self.finished = True
                    yield self._finish("stop", {})
                    return
            elif ev.port == "audio" and self.audio and "pcm" in data:
                pcm = _as_pcm(data["pcm"])
                rate = int(data.get("sample_rate") or 24000)
                if len(pcm):
                    self.timer.on_audio(len(pcm), rate)
                    yield AudioPiece(pcm, rate)
        # the stream ended without a final event: treat as a normal stop
        self.finished = True
        yield self._finish("stop", {})

    def _finish(self, reason: str, usage: dict) -> Finish:
        completion = int(usage.get("completion_tokens") or self.completion_tokens)
        self.timer.finish(completion)
        return Finish(reason, int(usage.get("prompt_tokens") or 0), completion)

    async def collect(self) -> Collected:
        out = Collected()
        async for piece in self.pieces():
            out.add(piece)
        return out
