"""POST /v1/audio/transcriptions and /v1/audio/translations (speech in any language -> English text).

Both take OpenAI's multipart form. Every field a client sends is served or refused with a 400 that
names it: `stream=true` sends the text as SSE `transcript.text.delta` events (in order, as
it is decoded) and a closing `transcript.text.done`; `timestamp_granularities[]` takes
`segment` and `word` (Whisper's words, aligned by cross-attention and DTW as transformers does);
with stream=true a Whisper sends each window's text as it decodes;
`verbose_json`
carries each segment's real `avg_logprob`, `no_speech_prob` and `compression_ratio` when the model
reports them (Whisper does), else null.
"""

from __future__ import annotations

from functools import partial

from aiohttp import web

from omni.api.connections import read_form, within_body_timeout
from omni.api.errors import as_api_error, bad_request
from omni.api.generation import Finish, KernelRequest, TextPiece
from omni.api.media import off_loop
from omni.api.metrics import RequestTimer
from omni.api.params import transcribe_params
from omni.api.schemas import TRANSCRIPTION_FORMATS
from omni.api.sse import SseStream
from omni.api.state import STATE

TRANSCRIBE_ROUTE = "/v1/audio/transcriptions"
TRANSLATE_ROUTE = "/v1/audio/translations"
_FIELDS = {"file", "model", "prompt", "response_format", "temperature", "stream", "timestamp_granularities[]"}
FIELDS = {"transcribe": _FIELDS | {"language"}, "translate": _FIELDS}
GRANULARITIES = ("segment", "word")
_SEGMENT_STATS = ("avg_logprob", "compression_ratio", "no_speech_prob")


def _timestamp(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d}{sep}{ms % 1000:03d}"


def _flag(fields: dict, name: str) -> bool:
    value = str(fields.get(name, "false")).strip().lower()
    if value not in ("true", "false", "1", "0"):
        raise bad_request(f"{name} must be true or false, got {value!r}", param=name, code="invalid_value")
    return value in ("true", "1")


def _temperature(fields: dict) -> float | None:
    if not fields.get("temperature"):
        return None
    try:
        temperature = float(fields["temperature"])
    except ValueError:
        raise bad_request("temperature must be a number", param="temperature", code="invalid_value") from None
    if not 0.0 <= temperature <= 2.0:
        raise bad_request("temperature must be within [0, 2]", param="temperature", code="invalid_value")
    return temperature


def _check_fields(fields: dict, task: str, fmt: str, stream: bool) -> None:
    unknown = sorted(set(fields) - FIELDS[task])
    if unknown:
        raise bad_request(f"{unknown[0]!r} is not a parameter this route serves (it takes "
                          f"{', '.join(sorted(FIELDS[task] - {'file'}))})", param=unknown[0],
                          code="unsupported_parameter")
    if fmt not in TRANSCRIPTION_FORMATS:
        raise bad_request(f"response_format must be one of {list(TRANSCRIPTION_FORMATS)}, got {fmt!r}",
                          param="response_format", code="invalid_value")
    granularities = fields.get("timestamp_granularities[]") or []
    for g in granularities:
        if g not in GRANULARITIES:
            raise bad_request(f"timestamp_granularities[] takes 'segment' or 'word', got {g!r}",
                              param="timestamp_granularities[]", code="invalid_value")
    if granularities and fmt != "verbose_json":
        raise bad_request("timestamp_granularities[] needs response_format 'verbose_json'",
                          param="timestamp_granularities[]", code="invalid_value")
    if stream and fmt not in ("json", "text"):
        raise bad_request(f"stream=true sends text deltas; response_format {fmt!r} cannot be streamed (use json "
                          "or text)", param="stream", code="invalid_value")


async def transcriptions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "transcribe")


async def translations(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "translate")


async def _serve(request: web.Request, task: str) -> web.StreamResponse:
    state = request.app[STATE]
    fields, audio = await within_body_timeout(request, read_form(request, state.config.limits.max_audio_bytes))
    if "model" not in fields:
        raise bad_request("missing form field 'model'", param="model", code="missing_field")
    if audio is None:
        raise bad_request("missing form field 'file' (the audio to transcribe)", param="file", code="missing_field")
    fmt = fields.get("response_format", "json")
    stream = _flag(fields, "stream")
    _check_fields(fields, task, fmt, stream)
    language = fields.get("language") or None
    granularities = fields.get("timestamp_granularities[]") or ["segment"]
    params, duration, served = await off_loop(partial(  # decoding runs off the event loop
        transcribe_params, state, fields["model"], audio, language, fields.get("prompt"), _temperature(fields),
        timestamps=fmt in ("verbose_json", "srt", "vtt"), task=task, words="word" in granularities))
    if stream:
        params["stream"] = True  # a Whisper sends text as it decodes, not only per 30 s window
    route = TRANSLATE_ROUTE if task == "translate" else TRANSCRIBE_ROUTE
    timer = RequestTimer(state.metrics, route)
    async with KernelRequest(served.kernel, params, timer, None, state.config.request_timeout_s) as gen:
        if stream:
            return await _stream(request, gen, duration)
        out = await gen.collect()
    return _whole(out, fmt, task, language, duration, granularities)


async def _stream(request: web.Request, gen: KernelRequest, duration: float) -> web.StreamResponse:
    sse = SseStream(request)
    texts: list[str] = []
    try:
        async for piece in gen.pieces():
            if isinstance(piece, TextPiece) and piece.text:
                delta = piece.text.lstrip() if not texts else piece.text
                texts.append(delta)
                if delta:
                    await sse.send({"type": "transcript.text.delta", "delta": delta})
            elif isinstance(piece, Finish):
                pass
    except ConnectionResetError:
        raise
    except Exception as exc:  # after the first event the status is sent: report in-band
        if not sse.started:
            raise
        return await sse.fail(as_api_error(exc))
    await sse.send({"type": "transcript.text.done", "text": "".join(texts).strip(),
                    "usage": {"type": "duration", "seconds": duration}})
    return await sse.done(marker=False)


def _whole(out, fmt: str, task: str, language: str | None, duration: float, granularities: list[str]
           ) -> web.Response:
    text = "".join(out.text).strip()
    if fmt == "text":
        return web.Response(text=text, content_type="text/plain")
    # a model that gives no timed segments gets one segment for the whole clip
    segments = [{**s, "start": float(s["start"]), "end": min(float(s["end"]), duration),
                 "text": str(s["text"]).strip()} for s in out.segments]
    segments = segments or [{"start": 0.0, "end": duration, "text": text, "tokens": []}]
    if fmt in ("srt", "vtt"):
        sep = "," if fmt == "srt" else "."
        cues = [f"{_timestamp(s['start'], sep)} --> {_timestamp(s['end'], sep)}\n{s['text']}\n" for s in segments]
        body = "\n".join(f"{i}\n{c}" for i, c in enumerate(cues, 1)) if fmt == "srt" else "WEBVTT\n\n" + "\n".join(cues)
        return web.Response(text=body, content_type="text/plain" if fmt == "srt" else "text/vtt")
    if fmt == "verbose_json":
        rows = [{"id": i, "seek": s.get("seek", 0), "start": s["start"], "end": s["end"], "text": s["text"],
                 "tokens": list(s.get("tokens", ())), "temperature": s.get("temperature", 0.0),
                 **{k: s.get(k) for k in _SEGMENT_STATS}} for i, s in enumerate(segments)]
        body = {"task": "translate" if task == "translate" else "transcribe",
                "language": out.language or language or "unknown", "duration": duration, "text": text,
                "usage": {"type": "duration", "seconds": duration}}
        if "segment" in granularities:
            body["segments"] = rows
        if "word" in granularities:
            body["words"] = [{**w, "end": min(w["end"], duration)} for w in out.words]
        return web.json_response(body)
    return web.json_response({"text": text, "usage": {"type": "duration", "seconds": duration}})
