"""One Realtime session: its settings, conversation, input audio buffer, voice detector and the
response in progress; client events in, server events out (through `send`, no socket here).

Every client event is handled in arrival order by `handle`; the only long work, a response, runs
in a task of its own so that audio keeps arriving (and a barge-in is heard) while it streams.
A bad event gets an `error` event naming it and changes nothing else.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from omni.api.errors import ApiError, as_api_error, bad_request
from omni.api.realtime.audio_buffer import InputAudio
from omni.api.realtime.config import SessionConfig
from omni.api.realtime.conversation import Conversation, Item, Part, item_from_event, new_id, pcm16_to_float
from omni.api.realtime.prefetch import AudioPrefetch
from omni.api.realtime.response import Response, ResponseOptions, audio_ms, error_event
from omni.api.realtime.transcripts import Transcripts
from omni.api.realtime.vad import VAD_RATE, WINDOW, SpeechDetector

if TYPE_CHECKING:
    from omni.api.state import ServerState

log = logging.getLogger("omni.api")
_VAD_POOL = ThreadPoolExecutor(2, thread_name_prefix="omni-vad")
MIN_COMMIT_MS = 100  # OpenAI refuses to commit less
_decode = msgspec.json.Decoder().decode


def hears(state: ServerState) -> bool:
    """Does the main model take audio input (else a served transcriber transcribes each audio turn for it)?"""
    return state.info.audio_input


class RealtimeSession:
    def __init__(self, state: ServerState, send: Callable[[dict], Awaitable[None]], model: str, beta: bool) -> None:
        self.state = state
        self.send = send
        self.beta = beta
        self.id = new_id("sess")
        self.config = SessionConfig.default(state, model)
        self.conversation = Conversation(state.budgets["conversation"].lease())
        self.audio = InputAudio(int(state.config.limits.max_audio_seconds * VAD_RATE),
                                state.budgets["realtime_audio"].lease())
        self.detector: SpeechDetector | None = None
        self.speech_item_id: str | None = None  # the id the turn being spoken will commit as
        self.response: Response | None = None
        self.task: asyncio.Task | None = None
        self.transcripts = Transcripts(state, send)
        self.hears = hears(state)
        self.prefetch = AudioPrefetch.of(state, self.hears, self.id)  # the turn's audio encoded while spoken

    async def start(self) -> None:
        await self._reset_detector()
        await self.send({"type": "session.created", "session": self.config.render(self.beta, self.id)})

    # ---- dispatch --------------------------------------------------------------------------

    async def handle(self, raw: str | bytes) -> None:
        event_id = None
        try:
            try:
                event = _decode(raw)
            except msgspec.DecodeError as exc:
                raise bad_request(f"the event is not valid JSON: {exc}", code="invalid_json") from None
            if not isinstance(event, dict):
                raise bad_request("an event must be a JSON object", code="invalid_event")
            event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
            kind = event.get("type")
            handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
            if handler is None:
                raise bad_request(f"unknown event type {kind!r}; served: {sorted(_HANDLERS)}", param="type",
                                  code="invalid_event_type")
            await handler(self, event)
        except ApiError as err:
            await self.send(error_event(err, event_id))
        except Exception as exc:  # a bug must not end the session: report it and go on
            log.exception("realtime event failed")
            await self.send(error_event(as_api_error(exc), event_id))

    async def close(self) -> None:
        """The socket is gone: cancel the response in every stage, free the detector, give the
        buffer and the conversation back to the server's budgets."""
        await self._cancel(None)
        if self.prefetch is not None:
            await self.prefetch.close()
        await self.transcripts.close()
        if self.detector is not None:
            await asyncio.get_running_loop().run_in_executor(_VAD_POOL, self.detector.close)
            self.detector = None
        self.audio.close()
        self.conversation.close()

    # ---- session and audio -----------------------------------------------------------------

    async def _session_update(self, event: dict) -> None:
        before = self.config.turn_detection
        self.config = self.config.updated(self.state, event.get("session"), "session")
        if (before is None) != (self.config.turn_detection is None) or (
                before and self.config.turn_detection and before.vad != self.config.turn_detection.vad):
            await self._reset_detector()
        await self.send({"type": "session.updated", "session": self.config.render(self.beta, self.id)})

    async def _reset_detector(self) -> None:
        loop = asyncio.get_running_loop()
        if self.detector is not None:
            await loop.run_in_executor(_VAD_POOL, self.detector.close)
            self.detector = None
        self.speech_item_id = None
        if self.config.turn_detection is not None:
            settings, start = self.config.turn_detection.vad, self.audio.end
            self.detector = await loop.run_in_executor(_VAD_POOL, SpeechDetector, settings, start)

    async def _append(self, event: dict) -> None:
        data = event.get("audio")
        if not isinstance(data, str):
            raise bad_request("audio must be base64 pcm16 (24 kHz mono)", param="audio", code="invalid_type")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise bad_request(f"audio is not valid base64: {exc}", param="audio", code="invalid_base64") from None
        pcm = pcm16_to_float(raw)
        if not len(pcm):
            return
        detector = self.detector
        changes = await asyncio.get_running_loop().run_in_executor(_VAD_POOL, self._hear, pcm, detector)
        for change in changes:
            if change.kind == "started":
                self.speech_item_id = new_id("item")
                self.audio.take(change.sample)  # the silence before the (padded) onset is not part of the turn
                await self.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": audio_ms(change.sample),
                                 "item_id": self.speech_item_id})
                detect = self.config.turn_detection
                if detect and detect.interrupt_response:
                    await self._cancel("turn_detected")  # a barge-in: the answer stops in every stage
            else:
                item_id = self.speech_item_id or new_id("item")
                self.speech_item_id = None
                await self.send({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": audio_ms(change.sample),
                                 "item_id": item_id})
                pcm = self.audio.take(change.sample)
                await self._commit(pcm, item_id)
                detect = self.config.turn_detection
                if detect and detect.create_response and self.task is None:
                    await self._start_response(ResponseOptions(self.config))
        if self.prefetch is not None and len(self.audio) and (detector is None or detector.speaking):
            self.prefetch.offer(self.audio)

    def _hear(self, pcm24: np.ndarray, detector: SpeechDetector | None) -> list:
        """On the VAD thread: resample into the buffer, run the detector on the new samples, and
        keep of the silence before a turn only what its onset padding may need."""
        pcm = self.audio.append(pcm24)
        if detector is None:
            return []
        changes = detector.feed(pcm)
        if not detector.speaking and not changes:
            keep = detector.settings.prefix_padding_ms * VAD_RATE // 1000 + 2 * WINDOW
            self.audio.take(self.audio.end - keep)
        return changes

    async def _commit_event(self, event: dict) -> None:
        if audio_ms(len(self.audio)) < MIN_COMMIT_MS:
            raise bad_request(f"the input audio buffer holds {audio_ms(len(self.audio))} ms of audio; a commit needs "
                              f"at least {MIN_COMMIT_MS} ms", code="input_audio_buffer_commit_empty")
        pcm = self.audio.take(self.audio.end)
        item_id, self.speech_item_id = self.speech_item_id or new_id("item"), None
        if self.detector is not None:
            self.detector.reset()
        await self._commit(pcm, item_id)

    async def _commit(self, pcm: np.ndarray, item_id: str) -> None:
        item = Item("user", [Part("input_audio", "", pcm)], id=item_id)
        self._check_room(pcm)
        previous = self.conversation.add(item)
        await self.send({"type": "input_audio_buffer.committed", "previous_item_id": previous, "item_id": item.id})
        await self._item_created(item, previous)
        self._transcribe_later(item)

    async def _clear(self, event: dict) -> None:
        self.audio.clear()
        self.speech_item_id = None
        if self.detector is not None:
            self.detector.reset()
        await self.send({"type": "input_audio_buffer.cleared"})

    # ---- conversation ------------------------------------------------------------------------

    async def _item_create(self, event: dict) -> None:
        item = item_from_event(event.get("item"), self.audio.resample_whole)
        for part in item.parts:
            if part.pcm is not None:
                self._check_room(part.pcm)
        previous = self.conversation.add(item, event.get("previous_item_id"))
        await self._item_created(item, previous)
        self._transcribe_later(item)

    async def _item_created(self, item: Item, previous: str | None) -> None:
        await self.send({"type": "conversation.item.created", "previous_item_id": previous,
                         "item": item.render(self.beta)})

    async def _item_delete(self, event: dict) -> None:
        item = self.conversation.get(event.get("item_id"))
        if self.response is not None and self.response.item is item:
            await self._cancel("client_cancelled")
        self.conversation.delete(item.id)
        await self.send({"type": "conversation.item.deleted", "item_id": item.id})

    async def _item_retrieve(self, event: dict) -> None:
        item = self.conversation.get(event.get("item_id"))
        await self.send({"type": "conversation.item.retrieved", "item": item.render(self.beta)})

    async def _item_truncate(self, event: dict) -> None:
        """The user heard only `audio_end_ms` of an answer: stop it if it still runs, and drop its
        transcript (as OpenAI does: the model must not read what the user never heard)."""
        item = self.conversation.get(event.get("item_id"))
        index, end = event.get("content_index", 0), event.get("audio_end_ms")
        if item.role != "assistant" or not isinstance(index, int) or not 0 <= index < len(item.parts) \
                or item.parts[index].kind != "audio":
            raise bad_request("only an assistant item's audio part can be truncated", param="content_index",
                              code="invalid_value")
        if isinstance(end, bool) or not isinstance(end, int) or end < 0:
            raise bad_request("audio_end_ms must be a non-negative integer", param="audio_end_ms", code="invalid_value")
        if self.response is not None and self.response.item is item:
            await self._cancel("client_cancelled")
        part = item.parts[index]
        if end > part.audio_ms:
            raise bad_request(f"audio_end_ms {end} is past the {part.audio_ms} ms of audio sent",
                              param="audio_end_ms", code="invalid_value")
        part.audio_ms, part.text, part.token_ids = end, "", None
        await self.send({"type": "conversation.item.truncated", "item_id": item.id, "content_index": index,
                         "audio_end_ms": end})

    def _check_room(self, pcm: np.ndarray) -> None:
        limit = self.state.config.limits.max_audio_seconds
        if self.conversation.audio_seconds() + len(pcm) / VAD_RATE > limit:
            raise bad_request(f"the conversation would hold more than {limit:.0f} s of audio; delete items first",
                              code="conversation_audio_limit")

    def _transcribe_later(self, item: Item) -> None:
        if not self.hears or self.config.transcribe_input:
            self.transcripts.start(item, self.config.transcription)

    async def _messages(self) -> list[dict]:
        if not self.hears:  # it reads the transcripts: wait for those still being made
            await self.transcripts.wait()
        return self.conversation.messages(self.config.instructions, self.hears)

    # ---- responses ---------------------------------------------------------------------------

    async def _response_create(self, event: dict) -> None:
        if self.task is not None:
            raise bad_request(f"response {self.response.id} is still in progress; cancel it first",
                              code="conversation_already_has_active_response")
        await self._start_response(ResponseOptions.parse(self.state, self.config, event.get("response")))

    async def _start_response(self, options: ResponseOptions) -> None:
        response = Response(self.state, options, self.send, self.beta, session=self.id)
        self.response = response
        self.task = asyncio.create_task(self._run(response))

    async def _run(self, response: Response) -> None:
        async def add_item(item: Item) -> None:
            await self._item_created(item, self.conversation.add(item))

        try:
            await response.run(self._messages, add_item)
        finally:
            self.conversation.settle()  # the answer's text and the transcripts made meanwhile
            if self.response is response:
                self.response, self.task = None, None

    async def _response_cancel(self, event: dict) -> None:
        wanted = event.get("response_id")
        if self.task is None or (wanted is not None and wanted != self.response.id):
            raise bad_request("there is no response in progress to cancel" if self.task is None else
                              f"response {wanted!r} is not the one in progress", code="response_cancel_not_active")
        await self._cancel("client_cancelled")

    async def _cancel(self, reason: str | None) -> None:
        """Cancel the running response and wait until it is over in every stage. `reason` None: the
        socket is gone (no events)."""
        task, response = self.task, self.response
        if task is None or task.done():
            return
        response.cancel_reason = reason
        task.cancel()
        await asyncio.shield(asyncio.wait([task]))


_HANDLERS: dict[str, Callable[[RealtimeSession, dict], Awaitable[None]]] = {
    "session.update": RealtimeSession._session_update,
    "input_audio_buffer.append": RealtimeSession._append,
    "input_audio_buffer.commit": RealtimeSession._commit_event,
    "input_audio_buffer.clear": RealtimeSession._clear,
    "conversation.item.create": RealtimeSession._item_create,
    "conversation.item.delete": RealtimeSession._item_delete,
    "conversation.item.retrieve": RealtimeSession._item_retrieve,
    "conversation.item.truncate": RealtimeSession._item_truncate,
    "response.create": RealtimeSession._response_create,
    "response.cancel": RealtimeSession._response_cancel,
}
