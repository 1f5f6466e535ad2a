"""POST /v1/chat/completions: text and speech answers, whole or streamed as SSE chunks."""

from __future__ import annotations

import base64
import time
import uuid

from aiohttp import web

from omni.api.audio_codec import StreamEncoder, encode_audio
from omni.api.connections import read_body
from omni.api.errors import as_api_error
from omni.api.generation import AudioPiece, Finish, KernelRequest, TextPiece
from omni.api.metrics import RequestTimer
from omni.api.params import chat_params, stop_strings
from omni.api.prompt_bounds import chat_chars, check_prompt_chars
from omni.api.schemas import ChatCompletionRequest, decode_body
from omni.api.sse import SseStream
from omni.api.state import STATE

ROUTE = "/v1/chat/completions"
AUDIO_TTL_S = 3600


def _usage(finish: Finish | None) -> dict:
    prompt = finish.prompt_tokens if finish else 0
    completion = finish.completion_tokens if finish else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    req = decode_body(await read_body(request), ChatCompletionRequest)
    check_prompt_chars(state.info, chat_chars(req))
    params = await chat_params(state, req)
    timer = RequestTimer(state.metrics, ROUTE)
    wants_audio = "audio" in params["modalities"]
    gen = KernelRequest(state.kernel, params, timer, stop_strings(req.stop), state.config.request_timeout_s,
                        audio=wants_audio)
    meta = {"id": "chatcmpl-" + uuid.uuid4().hex, "created": int(time.time()), "model": req.model}
    async with gen:
        if req.stream:
            return await _stream(request, gen, req, meta, wants_audio)
        return await _whole(gen, req, meta, wants_audio)


async def _whole(gen: KernelRequest, req: ChatCompletionRequest, meta: dict, wants_audio: bool) -> web.Response:
    out = await gen.collect()
    text = "".join(out.text)
    message: dict = {"role": "assistant", "content": text, "refusal": None}
    if wants_audio:
        fmt = req.audio.format if req.audio else "wav"
        data = encode_audio(out.pcm, out.sample_rate, fmt)
        message["audio"] = {"id": "audio_" + uuid.uuid4().hex, "data": base64.b64encode(data).decode(),
                            "format": fmt, "transcript": text, "expires_at": int(time.time()) + AUDIO_TTL_S}
    body = {**meta, "object": "chat.completion",
            "choices": [{"index": 0, "message": message,
                         "logprobs": {"content": out.logprobs, "refusal": None} if req.logprobs else None,
                         "finish_reason": out.finish.reason if out.finish else "stop"}],
            "usage": _usage(out.finish)}
    return web.json_response(body)


async def _stream(request: web.Request, gen: KernelRequest, req: ChatCompletionRequest, meta: dict,
                  wants_audio: bool) -> web.StreamResponse:
    sse = SseStream(request)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    audio_id = "audio_" + uuid.uuid4().hex
    expires_at = int(time.time()) + AUDIO_TTL_S
    encoder: StreamEncoder | None = None

    def chunk(delta: dict, finish_reason: str | None = None, logprobs: list | None = None) -> dict:
        body = {**meta, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                             "logprobs": {"content": logprobs, "refusal": None} if logprobs else None}]}
        if include_usage:
            body["usage"] = None
        return body

    finish: Finish | None = None
    try:
        async for piece in gen.pieces():
            if not sse.started:  # opened on the first piece, so earlier failures keep their HTTP status
                await sse.send(chunk({"role": "assistant", "content": ""}))
            if isinstance(piece, TextPiece):
                if piece.text or (req.logprobs and piece.logprobs):
                    delta: dict = {"content": piece.text}
                    if wants_audio:
                        delta["audio"] = {"id": audio_id, "transcript": piece.text, "expires_at": expires_at}
                    await sse.send(chunk(delta, logprobs=piece.logprobs if req.logprobs else None))
            elif isinstance(piece, AudioPiece):
                if encoder is None:
                    encoder = StreamEncoder("pcm16", piece.sample_rate)
                data = encoder.feed(piece.pcm)
                if data:
                    await sse.send(chunk({"audio": {"id": audio_id, "data": base64.b64encode(data).decode(),
                                                    "expires_at": expires_at}}))
            else:
                finish = piece
        if encoder is not None:
            tail = encoder.finish()
            if tail:
                await sse.send(chunk({"audio": {"id": audio_id, "data": base64.b64encode(tail).decode(),
                                                "expires_at": expires_at}}))
    except ConnectionResetError:  # the client left: KernelRequest's exit cancels the request
        raise
    except Exception as exc:  # after the first byte the status is sent: report in-band, then end
        if not sse.started:
            raise
        return await sse.fail(as_api_error(exc))
    await sse.send(chunk({}, finish.reason if finish else "stop"))
    if include_usage:
        await sse.send({**meta, "object": "chat.completion.chunk", "choices": [], "usage": _usage(finish)})
    return await sse.done()
