"""POST /v1/chat/completions: text and speech answers, whole or streamed as SSE chunks."""

from __future__ import annotations

import base64
import time
import uuid

from aiohttp import web

from omni.api.audio_codec import StreamEncoder, encode_audio
from omni.api.connections import UPLOAD, read_body, upload_lease
from omni.api.errors import as_api_error
from omni.api.choices import Choices, choice_params
from omni.api.generation import AudioPiece, Collected, Finish, KernelRequest, TextPiece
from omni.api.metrics import RequestTimer
from omni.api.params import chat_params, stop_strings
from omni.api.prompt_bounds import chat_chars, check_prompt_chars
from omni.api.schemas import ChatCompletionRequest, decode_body
from omni.api.sse import SseStream
from omni.api.state import STATE

ROUTE = "/v1/chat/completions"
AUDIO_TTL_S = 3600


def usage(finishes: list[Finish | None]) -> dict:
    """OpenAI's usage of n choices: the prompt once, every choice's completion."""
    prompt = next((f.prompt_tokens for f in finishes if f), 0)
    completion = sum(f.completion_tokens for f in finishes if f)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def kernel_requests(state, params: dict, n: int, route: str, stops: list[str], audio: bool = False) -> Choices:
    """The n choices of one request, each its own KernelRequest (choices.py): what chat and text
    completions both run."""
    return Choices([KernelRequest(state.kernel, choice_params(params, i, state.info.sampling_stage),
                                  RequestTimer(state.metrics, route), stops, state.config.request_timeout_s, audio=audio)
                    for i in range(n)])


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    req = decode_body(await read_body(request), ChatCompletionRequest)
    check_prompt_chars(state.info, chat_chars(req))
    params = await chat_params(state, req, lambda nbytes: _hold(request, nbytes))
    wants_audio = "audio" in params["modalities"]
    meta = {"id": "chatcmpl-" + uuid.uuid4().hex, "created": int(time.time()), "model": req.model}
    async with kernel_requests(state, params, req.n, ROUTE, stop_strings(req.stop), wants_audio) as choices:
        if req.stream:
            return await _stream(request, choices, req, meta, wants_audio)
        return await _whole(choices, req, meta, wants_audio)


def _hold(request: web.Request, nbytes: int) -> None:
    """Media decoded or fetched for the request, held on the `uploads` budget with its body."""
    upload_lease(request, (request[UPLOAD].bytes if UPLOAD in request else 0) + nbytes)


def _message(out: Collected, req: ChatCompletionRequest, wants_audio: bool) -> dict:
    text = "".join(out.text)
    message: dict = {"role": "assistant", "content": text, "refusal": None}
    if wants_audio:
        fmt = req.audio.format if req.audio else "wav"
        data = encode_audio(out.pcm, out.sample_rate, fmt)
        message["audio"] = {"id": "audio_" + uuid.uuid4().hex, "data": base64.b64encode(data).decode(),
                            "format": fmt, "transcript": text, "expires_at": int(time.time()) + AUDIO_TTL_S}
    return message


async def _whole(choices: Choices, req: ChatCompletionRequest, meta: dict, wants_audio: bool) -> web.Response:
    outs = await choices.collect()
    body = {**meta, "object": "chat.completion",
            "choices": [{"index": i, "message": _message(out, req, wants_audio),
                         "logprobs": {"content": out.logprobs, "refusal": None} if req.logprobs else None,
                         "finish_reason": out.finish.reason if out.finish else "stop"} for i, out in enumerate(outs)],
            "usage": usage([out.finish for out in outs])}
    return web.json_response(body)


async def _stream(request: web.Request, choices: Choices, req: ChatCompletionRequest, meta: dict,
                  wants_audio: bool) -> web.StreamResponse:
    sse = SseStream(request)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    audio_id = "audio_" + uuid.uuid4().hex
    expires_at = int(time.time()) + AUDIO_TTL_S
    encoder: StreamEncoder | None = None  # audio is served for one choice only (params.chat_params)

    def chunk(index: int, delta: dict, finish_reason: str | None = None, logprobs: list | None = None) -> dict:
        body = {**meta, "object": "chat.completion.chunk",
                "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason,
                             "logprobs": {"content": logprobs, "refusal": None} if logprobs else None}]}
        if include_usage:
            body["usage"] = None
        return body

    finishes: list[Finish | None] = [None] * len(choices.gens)
    opened: set[int] = set()
    try:
        async for index, piece in choices.pieces():
            if index not in opened:  # opened on the first piece, so earlier failures keep their HTTP status
                opened.add(index)
                await sse.send(chunk(index, {"role": "assistant", "content": ""}))
            if isinstance(piece, TextPiece):
                if piece.text or (req.logprobs and piece.logprobs):
                    delta: dict = {"content": piece.text}
                    if wants_audio:
                        delta["audio"] = {"id": audio_id, "transcript": piece.text, "expires_at": expires_at}
                    await sse.send(chunk(index, delta, logprobs=piece.logprobs if req.logprobs else None))
            elif isinstance(piece, AudioPiece):
                if encoder is None:
                    encoder = StreamEncoder("pcm16", piece.sample_rate)
                data = encoder.feed(piece.pcm)
                if data:
                    await sse.send(chunk(index, {"audio": {"id": audio_id, "data": base64.b64encode(data).decode(),
                                                           "expires_at": expires_at}}))
            else:
                finishes[index] = piece
                if encoder is not None:
                    tail = encoder.finish()
                    if tail:
                        await sse.send(chunk(index, {"audio": {"id": audio_id, "data": base64.b64encode(tail).decode(),
                                                               "expires_at": expires_at}}))
                await sse.send(chunk(index, {}, piece.reason))
    except ConnectionResetError:  # the client left: KernelRequest's exit cancels the request
        raise
    except Exception as exc:  # after the first byte the status is sent: report in-band, then end
        if not sse.started:
            raise
        return await sse.fail(as_api_error(exc))
    if include_usage:
        await sse.send({**meta, "object": "chat.completion.chunk", "choices": [], "usage": usage(finishes)})
    return await sse.done()
