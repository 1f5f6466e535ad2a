"""/v1/audio/voices: upload (POST), list (GET) and delete (DELETE /{id}) voices, and the `voice`
request params of a model that clones them (`ModelInfo.clones_voices`).

POST takes multipart (`audio_sample` file, `name`, optional `ref_text` and `consent`: vLLM-Omni's
and OpenAI's field names) or JSON (`audio_sample` as base64 or a data URL). The clip is decoded by
the shared media path at the model's speaker rate, within the media admission bounds (and at most
`voice_max_seconds`), then runs through the model's graph once as a voice-creation request
(task "voice"): its voice stage answers the prompt, which the store keeps. A bad clip (silent, too
short or long, undecodable) is a 4xx with the stage's or the decoder's reason.

In /v1/audio/speech (and chat's `audio.voice`), `voice` names an uploaded voice (name or id), and
an inline clip rides as `ref_audio` (base64 / data URL) + `ref_text` (+ `x_vector_only_mode`), as
vLLM-Omni names them; omni fetches no URL for it.
"""

from __future__ import annotations

import tempfile
import uuid
from dataclasses import replace
from typing import Any

import msgspec
from aiohttp import web

from omni.api.budgets import Budget
from omni.api.connections import read_body, read_form, within_body_timeout
from omni.api.errors import ApiError, as_api_error, bad_request, unknown_voice
from omni.api.media import audio_part, b64decode_strict, decode_audio
from omni.api.schemas import decode_body
from omni.api.voice_names import is_openai_voice
from omni.api.state import STATE
from omni.api.voices import Prompt, VoiceStore, check_name, namespace

ROUTE = "/v1/audio/voices"
DEFAULT_SPEAKER_RATE = 24000


def clones_voices(info) -> bool:
    return info.clones_voices


def open_store(info, config, budget: Budget | None = None) -> VoiceStore | None:
    """The voice store of a model that clones voices (None for any other model), on the server's
    `voice_cache` budget."""
    if not clones_voices(info):
        return None
    root = config.voice_dir or tempfile.mkdtemp(prefix="omni-voices-")  # omnid passes <cache dir>/voices
    return VoiceStore(f"{root}/{namespace(info)}", config.voice_cache_bytes,
                      lease=budget.lease() if budget is not None else None)


def _store(state) -> VoiceStore:
    if state.voices is None:
        raise bad_request(f"model {state.info.id!r} does not clone voices: it has no uploaded voices",
                          code="voice_cloning_not_supported")
    return state.voices


def _rate(state) -> int:
    return state.info.speaker_sample_rate or DEFAULT_SPEAKER_RATE


async def clip_part(state, raw: bytes, param: str, text: str | None) -> tuple[dict[str, Any], float]:
    """A reference clip's bytes -> the `voice_ref` param (mono at the speaker rate) and its seconds."""
    limits = state.config.limits
    bound = replace(limits, max_audio_seconds=min(limits.max_audio_seconds, state.config.voice_max_seconds))
    pcm, rate = await decode_audio(raw, param, bound, _rate(state))
    return {**audio_part(pcm, rate), "text": text or None}, len(pcm) / rate


async def speech_voice(state, voice: str | None, ref_audio: str | None, ref_text: str | None,
                       x_vector_only: bool | None) -> dict[str, Any]:
    """The params that carry a cloning model's voice for /v1/audio/speech (empty for other models)."""
    if not clones_voices(state.info):
        if ref_audio is not None:
            raise bad_request(f"model {state.info.id!r} does not clone voices: ref_audio is not taken",
                              param="ref_audio", code="voice_cloning_not_supported")
        return {}
    if ref_audio is not None:
        text = None if x_vector_only else ref_text
        if not x_vector_only and not (ref_text or "").strip():
            raise bad_request("ref_text (the clip's transcript) is needed, or set x_vector_only_mode",
                              param="ref_text", code="invalid_value")
        ref, _ = await clip_part(state, b64decode_strict(ref_audio, "ref_audio"), "ref_audio", text)
        return {"voice_ref": ref, "voice": None}
    return uploaded_voice(state, voice, "voice")


def uploaded_voice(state, voice: str | None, param: str) -> dict[str, Any]:
    """`voice` (an uploaded voice's name or id) -> the `voice_prompt` param; unknown is a 404."""
    if not clones_voices(state.info):
        return {}
    if not voice:
        raise bad_request(f"model {state.info.id!r} speaks in cloned voices: name an uploaded voice ({ROUTE}) "
                          "or send ref_audio + ref_text", param=param, code="voice_required")
    found = state.voices.find(voice)
    if found is None:
        known = ", ".join(v.name for v in state.voices.list()) or "none uploaded yet"
        if is_openai_voice(voice):  # what an OpenAI client sends unchanged: say why it names nothing here
            raise unknown_voice(voice, f"model {state.info.id!r} clones voices and has no built-in voices, so "
                                       f"OpenAI's {voice!r} names none until a voice is uploaded under that name: "
                                       f"POST {ROUTE} (multipart audio_sample + name={voice} + ref_text), or send "
                                       f"ref_audio + ref_text inline; uploaded: {known}", param)
        raise unknown_voice(voice, f"model {state.info.id!r} speaks only in uploaded voices ({known}); upload a "
                                   f"clip with POST {ROUTE} (it may be named {voice!r}) or send ref_audio", param)
    return {"voice_prompt": state.voices.prompt(found).params(), "voice": found.id}


class _JsonVoice(msgspec.Struct):
    name: str
    audio_sample: str
    ref_text: str | None = None
    consent: str | None = None


async def _fields(request: web.Request, max_bytes: int) -> tuple[dict[str, str], bytes]:
    
    if request.content_type.startswith("multipart/"):
        fields, audio = await within_body_timeout(request, read_form(request, max_bytes, ("audio_sample", "file")))
        if audio is None:
            raise bad_request("the form has no audio_sample file", param="audio_sample", code="missing_audio")
        return {k: v for k, v in fields.items() if isinstance(v, str)}, audio
    if request.content_type not in ("application/json", "application/octet-stream", ""):
        raise bad_request(f"send multipart/form-data (an audio_sample file, a name) or JSON, not {request.content_type!r}",
                          code="invalid_content_type")
    body = decode_body(await read_body(request), _JsonVoice)
    fields = {"name": body.name, "ref_text": body.ref_text or "", "consent": body.consent or ""}
    return fields, b64decode_strict(body.audio_sample, "audio_sample")


async def create(request: web.Request) -> web.Response:
    state = request.app[STATE]
    store = _store(state)
    fields, raw = await _fields(request, state.config.limits.max_audio_bytes)
    name = fields.get("name") or ""
    check_name(name)
    if name.lower() in {v.lower() for v in state.info.voices}:
        raise ApiError(409, f"{name!r} is one of the model's own voices; pick another name", param="name",
                       code="voice_exists")
    if store.find(name) is not None:
        raise ApiError(409, f"a voice named {name!r} exists; delete it first or pick another name", param="name",
                       code="voice_exists")
    text = (fields.get("ref_text") or fields.get("text") or "").strip() or None
    ref, seconds = await clip_part(state, raw, "audio_sample", text)
    prompt = await _compute(state, ref)
    voice = store.add(name, prompt, seconds, consent=fields.get("consent") or None)
    return web.json_response(voice.public())


async def _compute(state, ref: dict[str, Any]) -> Prompt:
    """Run the voice-creation request through the graph; the voice stage's answer is the prompt."""
    params = {"task": "voice", "voice_ref": ref, "input": "", "messages": [], "modalities": []}
    stream = state.kernel.submit(params, rid="voice-" + uuid.uuid4().hex[:16], deadline_s=state.config.request_timeout_s)
    found: dict[str, Any] | None = None
    done = False
    try:
        async for ev in stream:
            if ev.port == "voice_prompt" and ev.data:
                found = ev.data
            if ev.final:
                done = True
                break
        done = True
    except ApiError as err:
        raise _about_clip(err) from None
    except Exception as exc:
        raise _about_clip(as_api_error(exc)) from None
    finally:
        if not done:
            await stream.cancel()
    if found is None:
        raise ApiError(500, "the model's voice stage answered no voice", code="internal")
    return Prompt.from_output(found)


def _about_clip(err: ApiError) -> ApiError:
    """A 400 from the voice stage is about the clip: say so in `param`."""
    if err.status == 400 and err.param is None:
        err.param = "audio_sample"
    return err


async def list_voices(request: web.Request) -> web.Response:
    state = request.app[STATE]
    builtin = [{"id": v, "object": "audio.voice", "name": v, "type": "builtin"} for v in state.info.voices]
    uploaded = [v.public() for v in state.voices.list()] if state.voices is not None else []
    data = builtin + uploaded
    return web.json_response({"object": "list", "data": data, "voices": [v["name"] for v in data]})


async def delete(request: web.Request) -> web.Response:
    state = request.app[STATE]
    key = request.match_info["voice_id"]
    voice = _store(state).delete(key)
    if voice is None:
        raise ApiError(404, f"unknown voice {key!r}", param="voice_id", code="voice_not_found")
    return web.json_response({"id": voice.id, "object": "audio.voice.deleted", "name": voice.name, "deleted": True})


def install(app: web.Application) -> None:
    app.router.add_post(ROUTE, create)
    app.router.add_get(ROUTE, list_voices)
    app.router.add_delete(ROUTE + "/{voice_id}", delete)
