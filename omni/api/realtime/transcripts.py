"""Transcripts of the user's audio turns: for a model that does not hear (its responses read them,
so they wait for them) or when `input_audio_transcription` is asked; made by the served model that
transcribes (a Whisper beside the main one), one task per item, reported as
`conversation.item.input_audio_transcription.completed` / `.failed`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import numpy as np

from omni.api.errors import as_api_error, bad_request
from omni.api.generation import KernelRequest
from omni.api.media import audio_part
from omni.api.metrics import RequestTimer
from omni.api.realtime.conversation import Item
from omni.api.realtime.response import ROUTE, error_event
from omni.api.realtime.vad import VAD_RATE

if TYPE_CHECKING:
    from omni.api.state import ServerState


class Transcripts:
    def __init__(self, state: ServerState, send: Callable[[dict], Awaitable[None]]) -> None:
        self.state, self.send = state, send
        self.tasks: dict[str, asyncio.Task] = {}

    def start(self, item: Item, options: dict) -> None:
        if item.untranscribed():
            self.tasks[item.id] = asyncio.create_task(self._run(item, dict(options)))

    async def wait(self) -> None:
        pending = [t for t in self.tasks.values() if not t.done()]
        if pending:
            await asyncio.wait(pending)

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await self.wait()

    async def _run(self, item: Item, options: dict) -> None:
        for index, part in enumerate(item.parts):
            if part.kind != "input_audio" or part.transcribed:
                continue
            try:
                part.text = await transcribe(self.state, part.pcm, options)
                part.transcribed = True
                await self.send({"type": "conversation.item.input_audio_transcription.completed", "item_id": item.id,
                                 "content_index": index, "transcript": part.text})
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self.send({"type": "conversation.item.input_audio_transcription.failed", "item_id": item.id,
                                 "content_index": index, "error": error_event(as_api_error(exc))["error"]})


async def transcribe(state: ServerState, pcm: np.ndarray, options: dict) -> str:
    """One audio turn to text (`options`: its language and prompt)."""
    served = state.transcriber(state.info.id)
    if served is None:
        raise bad_request(f"model {state.info.id!r} does not take audio and no served model transcribes it",
                          code="transcription_not_supported")
    params = {"task": "transcribe", "audio": audio_part(pcm, VAD_RATE), "language": options.get("language"),
              "modalities": ["text"], "messages": [], "sampling": {}}
    if options.get("prompt"):
        params["prompt"] = options["prompt"]
    gen = KernelRequest(served.kernel, params, RequestTimer(state.metrics, ROUTE), [],
                        state.config.request_timeout_s, audio=False)
    async with gen:
        out = await gen.collect()
    return "".join(out.text).strip()
