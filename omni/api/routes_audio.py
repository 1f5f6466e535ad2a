"""POST /v1/audio/speech: audio bytes streamed as made, or SSE (transcriptions: routes_transcribe).

WAV (and FLAC) come whole, with true sizes in the header, unless the request says `"stream": true`
(audio_codec.py): every other format streams as it is made.

`speed` is applied here by resampling the model's audio (soxr, streaming): faster speech is also
higher-pitched, as on a tape. A model that sets `ModelInfo.applies_speed` gets the speed
in its params instead and its audio passes through untouched.
"""

from __future__ import annotations

import base64
import logging

import numpy as np
from aiohttp import web

from omni.api.audio_codec import CONTENT_TYPES, StreamEncoder
from omni.api.client_output import write_stream
from omni.api.connections import read_body
from omni.api.errors import as_api_error
from omni.api.generation import AudioPiece, Finish, KernelRequest
from omni.api.metrics import RequestTimer
from omni.api.params import model_applies_speed, speech_params
from omni.api.prompt_bounds import check_prompt_chars
from omni.api.routes_voices import speech_voice
from omni.api.schemas import SpeechRequest, decode_body
from omni.api.sse import SseStream
from omni.api.state import STATE

log = logging.getLogger("omni.api")
SPEECH_ROUTE = "/v1/audio/speech"


class SpeedChanger:
    """Plays audio `speed` times faster by resampling it, chunk by chunk."""

    def __init__(self, speed: float, sample_rate: int) -> None:
        import soxr

        self._stream = soxr.ResampleStream(sample_rate * speed, sample_rate, 1, dtype="float32")

    def feed(self, pcm: np.ndarray, last: bool = False) -> np.ndarray:
        return self._stream.resample_chunk(np.asarray(pcm, dtype=np.float32), last=last)


async def speech(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    req = decode_body(await read_body(request), SpeechRequest)
    check_prompt_chars(state.info, len(req.input), "input")
    params = speech_params(state, req)
    params.update(await speech_voice(state, params["voice"], req.ref_audio, req.ref_text, req.x_vector_only_mode))
    timer = RequestTimer(state.metrics, SPEECH_ROUTE)
    changer_needed = req.speed != 1.0 and not model_applies_speed(state)
    sse = SseStream(request) if req.stream_format == "sse" else None
    response: web.StreamResponse | None = None
    encoder: StreamEncoder | None = None
    changer: SpeedChanger | None = None
    finish: Finish | None = None

    async def send(data: bytes) -> None:
        nonlocal response
        if not data:
            return
        if sse is not None:
            await sse.send({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
            return
        if response is None:
            response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPES[req.response_format]})
            await response.prepare(request)
        await write_stream(request, response, data)

    async with KernelRequest(state.kernel, params, timer, None, state.config.request_timeout_s) as gen:
        try:
            async for piece in gen.pieces():
                if isinstance(piece, AudioPiece):
                    if encoder is None:
                        encoder = StreamEncoder(req.response_format, piece.sample_rate, stream_wav=req.stream)
                        changer = SpeedChanger(req.speed, piece.sample_rate) if changer_needed else None
                    pcm = changer.feed(piece.pcm) if changer else piece.pcm
                    await send(encoder.feed(pcm))
                elif isinstance(piece, Finish):
                    finish = piece
            if encoder is None:  # no audio at all: still a valid, empty file
                encoder = StreamEncoder(req.response_format, state.info.sample_rate, stream_wav=req.stream)
            tail = encoder.feed(changer.feed(np.zeros(0, np.float32), last=True)) if changer else b""
            await send(tail + encoder.finish())
        except ConnectionResetError:
            raise
        except Exception as exc:
            started = response is not None or (sse is not None and sse.started)
            if not started:
                raise
            log.warning("speech stream %s failed after it started: %s", gen.rid, exc)
            if sse is not None:
                return await sse.fail(as_api_error(exc))
            if request.transport is not None:  # a cut-off body, so the client cannot mistake it for whole
                request.transport.close()
            return response
    if sse is not None:
        usage = {"input_tokens": finish.prompt_tokens if finish else 0,
                 "output_tokens": finish.completion_tokens if finish else 0}
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        await sse.send({"type": "speech.audio.done", "usage": usage})
        return await sse.done(marker=False)
    if response is None:  # nothing was encoded (pcm of no samples)
        return web.Response(body=b"", headers={"Content-Type": CONTENT_TYPES[req.response_format]})
    await response.write_eof()
    return response


