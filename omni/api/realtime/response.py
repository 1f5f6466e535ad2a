"""One Realtime response: the whole conversation as one chat request to the kernel, its text and
audio streamed back as `response.*` events, the answer kept in the conversation.

Cancelling the task that runs it (`response.cancel`, a barge-in, a truncate, a dropped socket)
leaves `KernelRequest`, whose exit cancels the request in every stage at once; the response then
ends with `response.done` of status `cancelled` (unless the socket is gone).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from omni.api.audio_codec import StreamEncoder
from omni.api.errors import ApiError, as_api_error, bad_request
from omni.api.generation import AudioPiece, Finish, KernelRequest, TextPiece
from omni.api.metrics import RequestTimer
from omni.api.params import stage_sampling
from omni.api.prompt_bounds import check_prompt_chars
from omni.api.realtime.config import SessionConfig, ga_modalities
from omni.api.realtime.conversation import Item, Part, new_id
from omni.api.realtime.vad import VAD_RATE
from omni.cluster.balancer import SESSION

if TYPE_CHECKING:
    from omni.api.state import ServerState

log = logging.getLogger("omni.api")
ROUTE = "/v1/realtime"


@dataclass
class ResponseOptions:
    """`response.create`'s `response` object over the session's settings."""

    config: SessionConfig
    metadata: Any = None

    @classmethod
    def parse(cls, state: ServerState, session: SessionConfig, body: Any) -> ResponseOptions:
        body = body if body is not None else {}
        if not isinstance(body, dict):
            raise bad_request("response must be an object", param="response", code="invalid_type")
        if body.get("conversation", "auto") != "auto" or body.get("input") is not None:
            raise bad_request("only responses over the session's conversation are served (conversation 'auto', "
                              "no input)", param="response.conversation", code="unsupported_parameter")
        allowed = {k: body[k] for k in ("modalities", "output_modalities", "instructions", "voice", "temperature",
                                        "max_response_output_tokens", "max_output_tokens", "tools", "audio",
                                        "stage_sampling") if k in body}
        return cls(session.updated(state, allowed, "response"), body.get("metadata"))


@dataclass
class Response:
    state: ServerState
    options: ResponseOptions
    send: Callable[[dict], Awaitable[None]]
    beta: bool
    id: str = field(default_factory=lambda: new_id("resp"))
    item: Item | None = None
    status: str = "in_progress"
    cancel_reason: str | None = None
    usage: dict = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    announced: bool = False  # its item was added to the conversation
    first_audio_s: float | None = None  # from response.create (or the end of the turn) to the first audio
    session: str = ""  # the socket's session id: every turn goes to the replicas its session used (balancer.py)

    @property
    def speaks(self) -> bool:
        return "audio" in self.options.config.modalities

    def render(self) -> dict:
        config = self.options.config
        details = None
        if self.status == "cancelled":
            details = {"type": "cancelled", "reason": self.cancel_reason or "client_cancelled"}
        elif self.status == "incomplete":
            details = {"type": "incomplete", "reason": "max_output_tokens"}
        body = {"id": self.id, "object": "realtime.response", "status": self.status, "status_details": details,
                "output": [self.item.render(self.beta)] if self.announced and self.status != "in_progress" else [],
                "usage": self.usage or None, "metadata": self.options.metadata,
                "conversation_id": "conv_omni", "voice": config.voice,
                "max_output_tokens": config.max_tokens()}
        if self.beta:
            body["modalities"] = list(config.modalities)
            body["output_audio_format"] = "pcm16"
            body["temperature"] = config.temperature if config.temperature is not None else 0.8
        else:
            body["output_modalities"] = ga_modalities(config.modalities)
            body["audio"] = {"output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": config.voice}}
        if self.first_audio_s is not None:
            body["omni"] = {"time_to_first_audio_s": round(self.first_audio_s, 4)}
        return body

    def params(self, messages: list[dict]) -> dict:
        config = self.options.config
        base = {"temperature": config.temperature, "max_tokens": config.max_output_tokens}
        base = {k: v for k, v in base.items() if v is not None}
        extra = config.stage_sampling
        return {"task": "chat", "messages": messages, "modalities": list(config.modalities),
                "voice": config.voice if self.speaks else None, "sampling": stage_sampling(self.state, base, extra),
                SESSION: self.session}

    async def run(self, messages: Callable[[], Awaitable[list[dict]]], add_item: Callable[[Item], Awaitable[None]]
                  ) -> None:
        """Stream the answer; always ends with `response.done` while the socket lives."""
        await self.send({"type": "response.created", "response": self.render()})
        part = Part("audio" if self.speaks else "text")
        self.item = Item("assistant", [part], id=new_id("item"), status="in_progress")
        refs = {"response_id": self.id, "item_id": self.item.id, "output_index": 0, "content_index": 0}
        try:
            messages = await messages()  # waits for the transcripts a model that does not hear needs
            check_prompt_chars(self.state.info, sum(len(m["content"]) for m in messages
                                                    if isinstance(m["content"], str)))
            await self.send({"type": "response.output_item.added", "response_id": self.id, "output_index": 0,
                             "item": self.item.render(self.beta)})
            await add_item(self.item)
            self.announced = True
            await self.send({"type": "response.content_part.added", **refs, "part": part.render(self.beta)})
            await self._stream(self.params(messages), part, refs)
        except asyncio.CancelledError:
            self.status = "cancelled"
            if self.cancel_reason is None:  # not ours: the socket is gone, nothing left to tell
                raise
            await self._finish(part, refs)
            return
        except Exception as exc:
            self.status = "failed"
            err = as_api_error(exc)
            if err.status >= 500:
                log.warning("realtime response %s failed: %s", self.id, exc)
            await self.send(error_event(err))
        await self._finish(part, refs)

    async def _stream(self, params: dict, part: Part, refs: dict) -> None:
        timer = RequestTimer(self.state.metrics, ROUTE)
        gen = KernelRequest(self.state.kernel, params, timer, [], self.state.config.request_timeout_s,
                            audio=self.speaks)
        encoder: StreamEncoder | None = None
        text_kind = "response.audio_transcript.delta" if self.speaks else "response.text.delta"
        ids: list[int] = []
        async with gen:
            async for piece in gen.pieces():
                if isinstance(piece, TextPiece):
                    ids.extend(piece.token_ids or ())
                    if piece.text:
                        part.text += piece.text
                        await self.send({"type": text_kind, **refs, "delta": piece.text})
                elif isinstance(piece, AudioPiece):
                    encoder = encoder or StreamEncoder("pcm16", piece.sample_rate)
                    await self._audio(encoder.feed(piece.pcm), part, refs)
                elif isinstance(piece, Finish):
                    self.status = "incomplete" if piece.reason == "length" else "completed"
                    part.token_ids = ids if ids else None  # only a whole answer's ids stand for its text
                    self.usage = {"total_tokens": piece.prompt_tokens + piece.completion_tokens,
                                  "input_tokens": piece.prompt_tokens, "output_tokens": piece.completion_tokens}
            if encoder is not None:
                await self._audio(encoder.finish(), part, refs)

    async def _audio(self, data: bytes, part: Part, refs: dict) -> None:
        if not data:
            return
        if self.first_audio_s is None:
            self.first_audio_s = time.perf_counter() - self.started
        part.audio_ms += len(data) * 1000 // (2 * 24000)
        await self.send({"type": "response.audio.delta", **refs, "delta": base64.b64encode(data).decode()})

    async def _finish(self, part: Part, refs: dict) -> None:
        self.item.status = "completed" if self.status == "completed" else "incomplete"
        if not self.announced:  # it ended before its item was added (a refused prompt): only the done
            await self.send({"type": "response.done", "response": self.render()})
            return
        if self.speaks:
            await self.send({"type": "response.audio.done", **refs})
            await self.send({"type": "response.audio_transcript.done", **refs, "transcript": part.text})
        else:
            await self.send({"type": "response.text.done", **refs, "text": part.text})
        await self.send({"type": "response.content_part.done", **refs, "part": part.render(self.beta)})
        await self.send({"type": "response.output_item.done", "response_id": self.id, "output_index": 0,
                         "item": self.item.render(self.beta)})
        await self.send({"type": "response.done", "response": self.render()})


def error_event(err: ApiError, event_id: str | None = None) -> dict:
    return {"type": "error", "error": {"type": err.type, "code": err.code, "message": err.message,
                                       "param": err.param, "event_id": event_id}}


def audio_ms(samples: int) -> int:
    return samples * 1000 // VAD_RATE
