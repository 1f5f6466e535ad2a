"""Validated OpenAI requests -> the `params` dict the entry stage takes (the kernel's request contract).

Everything a client can get wrong is checked here, before anything is submitted: the model name,
the voice, stage names in `stage_sampling`, and every piece of media.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from omni.api.aliases import chats, completes, translates
from omni.api.decode_errors import decode_refusal
from omni.api.errors import ApiError, bad_request, unknown_voice
from omni.api.media import (
    MODEL_AUDIO_RATE,
    AudioBudget,
    audio_part,
    b64decode_strict,
    decode_audio,
    decode_audio_bytes,
    fetch_image,
    off_loop,
    parse_image_url,
)
from omni.api.media_video import video_content
from omni.api.routes_voices import uploaded_voice
from omni.api.voice_names import OPENAI_VOICES, is_openai_voice, own_voice, voice_description
from omni.api.schemas import (
    UNSERVED_CHAT_FIELDS,
    UNSERVED_COMPLETION_FIELDS,
    AudioPart,
    ChatCompletionRequest,
    CompletionRequest,
    ImagePart,
    MmProcessorKwargs,
    SpeechRequest,
    StageSampling,
    TextPart,
    VideoPart,
    VoiceId,
)

from omni.sampling import Sampling, SamplingFields

if TYPE_CHECKING:
    from omni.api.state import ServedModel, ServerState


def check_model(state: ServerState, name: str, param: str = "model", main_only: bool = True,
                chat: bool = False) -> None:
    """404 for an unknown model; with `main_only`, a 400 for a model served beside the main one (it
    only serves its own route, e.g. a transcriber only /v1/audio/transcriptions); with `chat`, a 400
    when the main model does not chat (a text-to-speech model)."""
    if state.model_info(name) is None:
        raise ApiError(404, f"model {name!r} is not served here; served: {state.model_names()}", param=param,
                       code="model_not_found")
    if main_only and state.model_info(name) is not state.info:
        raise bad_request(f"model {name!r} only serves /v1/audio/transcriptions; for this route use "
                          f"{state.info.id!r}", param=param, code="model_not_supported")
    if chat and not chats(state.info):
        raise bad_request(f"model {state.info.id!r} does not chat: it only serves /v1/audio/speech",
                          param=param, code="model_not_supported")


def resolve_voice(state: ServerState, voice: str | None, param: str) -> str | None:
    """The model's speaker a request's voice names: its own (case-insensitive) or one of OpenAI's
    names (voice_names.py); anything else is the one unknown-voice 400 of every model. A model
    without named speakers passes it on (a cloning model's uploads are checked by routes_voices)."""
    voices = state.info.voices
    if voice is None:
        return voices[0] if voices else None
    if designs_voices(state.info):
        if not is_openai_voice(voice):
            raise unknown_voice(voice, f"model {state.info.id!r} designs its voice from `instructions`; `voice` "
                                       f"takes only OpenAI's names ({', '.join(OPENAI_VOICES)}), each standing for "
                                       "a description used when no instructions are sent", param)
        return voice.strip().lower()
    if not voices:
        return voice
    found = own_voice(state.info, voice)
    if found is None:
        raise unknown_voice(voice, f"this model's voices are: {', '.join(voices)} (or OpenAI's names: "
                                   f"{', '.join(OPENAI_VOICES)})", param)
    return found


def designs_voices(info) -> bool:
    """A model whose voice is described in `instructions`, not named (Qwen3-TTS VoiceDesign)."""
    return info.designs_voices


def stage_sampling(model: ServerState | ServedModel, base: dict, extra: dict[str, StageSampling] | None
                   ) -> dict[str, Sampling]:
    """The request's sampling per stage: the top-level fields (`base`) for the model's
    `sampling_stage`, then `stage_sampling`'s stages (their fields win); unknown stage names are a
    400. A model without a sampling stage takes no top-level sampling fields."""
    key = model.info.sampling_stage
    sampling = {key: _typed(base)} if base and key else {}
    known = sorted(model.stage_names)
    for name, fields in (extra or {}).items():
        if name not in known:
            raise bad_request(f"stage_sampling names unknown stage {name!r}; stages: {known}",
                              param=f"stage_sampling.{name}", code="unknown_stage")
        given = {f: v for f in fields.__struct_fields__ if (v := getattr(fields, f)) is not None}
        sampling[name] = _typed({**(sampling[name].given() if name in sampling else {}), **given})
    return sampling


def _typed(fields: dict) -> Sampling:
    """Checked as the bus will check it (a value out of range is this 400, not a lost request)."""
    try:
        return msgspec.convert(fields, Sampling)
    except msgspec.ValidationError as exc:
        raise decode_refusal(exc, msgspec.json.encode(fields), Sampling) from None


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's string token ids as ints; a key that is not an id is a 400."""
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        if not key.isdigit():
            raise bad_request(f"logit_bias keys are token ids, got {key!r}", param="logit_bias", code="invalid_value")
        out[int(key)] = float(value)
    return out


def stop_strings(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    return [s for s in stops if s]


def refuse_unserved(req: ChatCompletionRequest | CompletionRequest, table: dict[str, tuple] = UNSERVED_CHAT_FIELDS) -> None:
    """A 400 naming the first OpenAI parameter set to something omni does not serve (tools...)."""
    for name, served in table.items():
        value = getattr(req, name)
        if value is not None and value not in served:
            what = "tool calling is" if name in ("tools", "tool_choice", "functions", "function_call") else f"{name} is"
            raise bad_request(f"{what} not supported by this server; remove {name!r} from the request",
                              param=name, code="unsupported_parameter")


def logprobs_asked(state: ServerState, req: ChatCompletionRequest) -> int | None:
    """How many alternatives each token's log-prob comes with (None: none asked); a 400 where the
    model cannot report them or top_logprobs comes without logprobs (as OpenAI answers)."""
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs=true", param="top_logprobs", code="invalid_value")
    if not req.logprobs:
        return None
    if not state.info.logprobs:
        raise bad_request(f"model {state.info.id!r} does not report log-probabilities", param="logprobs",
                          code="unsupported_parameter")
    return req.top_logprobs or 0


def sampling_fields(req: ChatCompletionRequest | CompletionRequest, max_tokens: int | None,
                    logprobs: int | None = None) -> dict:
    """The request's top-level sampling fields (those set), for the model's sampling stage: the
    same for chat and text completions, so both draw from the one sampler alike."""
    base = {name: getattr(req, name) for name in SamplingFields.__struct_fields__}
    base.update(max_tokens=max_tokens, logit_bias=_logit_bias(req.logit_bias), logprobs=logprobs)
    return {k: v for k, v in base.items() if v is not None}


def completion_params(state: ServerState, req: CompletionRequest) -> list[dict]:
    """One params dict per prompt of a text completion (task "complete": the text as it is)."""
    check_model(state, req.model, chat=True)
    refuse_unserved(req, UNSERVED_COMPLETION_FIELDS)
    if not completes(state.info):
        raise bad_request(f"model {state.info.id!r} does not serve text completions; use /v1/chat/completions",
                          param="model", code="model_not_supported")
    prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    if not all(isinstance(p, str) for p in prompts):
        raise bad_request("prompt must be a string or a list of strings (token ids are not served)", param="prompt",
                          code="invalid_value")
    base = sampling_fields(req, req.max_tokens)
    return [{"task": "complete", "prompt": prompt, "messages": [], "modalities": ["text"], "voice": None,
             "sampling": stage_sampling(state, base, req.stage_sampling)} for prompt in prompts]


async def chat_params(state: ServerState, req: ChatCompletionRequest, hold=None) -> dict:
    """`hold(nbytes)`: media the request holds beyond its body (a fetched video, its decoded track)
    taken on the request's memory budget (routes_chat: the `uploads` budget, with the body)."""
    check_model(state, req.model, chat=True)
    refuse_unserved(req)
    modalities = list(dict.fromkeys(req.modalities or ["text"]))
    wants_audio = "audio" in modalities
    voice = None
    if wants_audio:
        if not state.info.speaks:
            raise bad_request(f"model {state.info.id!r} does not produce audio; use modalities ['text']",
                              param="modalities", code="audio_not_supported")
        if req.n > 1:
            raise bad_request(f"n={req.n} answers are served as text only; with audio output ask for n=1",
                              param="n", code="unsupported_value")
        if "text" not in modalities:
            modalities.insert(0, "text")
        voice = resolve_voice(state, req.audio.voice if req.audio else None, "audio.voice")
        if req.stream and req.audio is not None and req.audio.format != "pcm16":
            raise bad_request("streamed audio is sent as pcm16; set audio.format to 'pcm16' or stream=false",
                              param="audio.format", code="unsupported_stream_format")
    messages, audio_budget = [], AudioBudget(state.config.limits)  # one bound on all of a request's audio
    mm = req.mm_processor_kwargs or MmProcessorKwargs()
    if mm.do_sample_frames is False:
        raise bad_request("do_sample_frames=false (every frame of a video) is not served; videos are sampled at "
                          "`fps` frames a second", param="mm_processor_kwargs.do_sample_frames",
                          code="unsupported_value")
    video = {"use_audio": mm.use_audio_in_video, "fps": mm.fps}
    for i, msg in enumerate(req.messages):
        messages.append({"role": "system" if msg.role == "developer" else msg.role,
                         "content": await _content(state, msg.content, f"messages[{i}].content", audio_budget,
                                                   video, hold)})
        if msg.token_ids is not None and msg.role == "assistant":  # the prompt takes them, not the text
            messages[-1]["token_ids"] = msg.token_ids
    base = sampling_fields(req, req.max_completion_tokens or req.max_tokens, logprobs_asked(state, req))
    params = {"task": "chat", "messages": messages, "modalities": modalities, "voice": voice,
              "sampling": stage_sampling(state, base, req.stage_sampling)}
    if wants_audio:  # an uploaded voice of a model that clones voices
        params.update(uploaded_voice(state, voice, "audio.voice"))
    return params


async def _content(state: ServerState, content, param: str, audio_budget: AudioBudget,
                   video: dict | None = None, hold=None) -> str | list[dict]:
    """A string stays a string (the model renders it in its template's content format); parts are
    checked and their media decoded."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[dict] = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if isinstance(part, TextPart):
            parts.append({"type": "text", "text": part.text})
        elif isinstance(part, AudioPart):
            raw = b64decode_strict(part.input_audio.data, f"{where}.input_audio.data")
            pcm, rate = await decode_audio(raw, f"{where}.input_audio.data", state.config.limits, MODEL_AUDIO_RATE)
            audio_budget.take(len(pcm) / rate, f"{where}.input_audio.data")
            parts.append({"type": "audio", **audio_part(pcm, rate)})
        elif isinstance(part, ImagePart):
            data, url = await off_loop(parse_image_url, part.image_url.url, f"{where}.image_url.url",
                                       state.config.limits)
            if data is None:
                data = await fetch_image(url, f"{where}.image_url.url", state.config.limits)
            parts.append({"type": "image", "data": data})
        elif isinstance(part, VideoPart):
            video = video or {}
            parts.append(await video_content(part.video_url.url, f"{where}.video_url.url", state.config.limits,
                                             bool(video.get("use_audio")), audio_budget, hold))
            if video.get("fps"):
                parts[-1]["fps"] = float(video["fps"])
    return parts


def speech_params(state: ServerState, req: SpeechRequest) -> dict:
    check_model(state, req.model)
    if not state.info.speaks:
        raise bad_request(f"model {state.info.id!r} does not speak; no loaded model serves /v1/audio/speech",
                          code="speech_not_supported")
    if not req.input.strip():
        raise bad_request("input is blank", param="input", code="invalid_value")
    voice = resolve_voice(state, req.voice.id if isinstance(req.voice, VoiceId) else req.voice, "voice")
    # speed is applied by the API (resampling, see routes_audio) unless the model says it applies it
    speed = req.speed if model_applies_speed(state) else 1.0
    params = {"task": "speech", "input": req.input, "voice": voice, "speed": speed,
              "modalities": ["audio"], "messages": [],
              "sampling": stage_sampling(state, {}, req.stage_sampling)}
    takes = state.info.instructions  # a model that takes instructions (or refuses them) says so
    if req.instructions and takes is False:
        raise bad_request(f"model {state.info.id!r} takes no instructions", param="instructions",
                          code="unsupported_value")
    if req.instructions and takes:
        params["instructions"] = req.instructions
    elif designs_voices(state.info) and voice:  # the OpenAI voice's description stands in (voice_names.py)
        params["instructions"] = voice_description(voice)
    return params


def model_applies_speed(state: ServerState) -> bool:
    return state.info.applies_speed


def _transcriber(state: ServerState, model: str, task: str) -> ServedModel:
    """The served model that does `task` for a request naming `model`. A model that does not do it
    at all is refused by its name (param=model), saying which served name does: a transcript is
    never silently some other model's. One that does it with random weights hands it to a trained one."""
    info = state.model_info(model)
    if translates(info) if task == "translate" else info.transcribes:
        return state.transcriber(model, task)
    route, verb = ("/v1/audio/translations", "translate") if task == "translate" else \
        ("/v1/audio/transcriptions", "transcribe")
    why = f" ({info.no_translation_reason})" if task == "translate" and info.no_translation_reason else ""
    doer = state.transcriber("", task)  # "": no model named, any served one that does it
    if doer is None:
        hint = f"; no served model serves {route}"
    else:
        names = [n for n in state.model_names() if state.model_info(n) is doer.info]
        hint = f"; for {route} use {', '.join(repr(n) for n in names)}"
    raise bad_request(f"model {model!r} does not {verb}{why}{hint}", param="model", code="model_not_supported")


def transcribe_params(state: ServerState, model: str, raw_audio: bytes, language: str | None,
                      prompt: str | None, temperature: float | None, timestamps: bool = False,
                      task: str = "transcribe", words: bool = False) -> tuple[dict, float, ServedModel]:
    """The params, the input's duration in seconds, and the served model that transcribes (or
    translates) it (`_transcriber`)."""
    check_model(state, model, main_only=False)
    served = _transcriber(state, model, task)
    pcm, rate = decode_audio_bytes(raw_audio, "file", state.config.limits, MODEL_AUDIO_RATE)
    base = {"temperature": temperature} if temperature is not None else {}
    params = {"task": task, "audio": audio_part(pcm, rate), "language": language,
              "modalities": ["text"], "messages": [], "sampling": stage_sampling(served, base, None)}
    if prompt:
        params["prompt"] = prompt
    if timestamps:
        params["timestamps"] = True
    if words:
        if not served.info.word_timestamps:
            raise bad_request(f"model {served.info.id!r} does not time words", param="timestamp_granularities[]",
                              code="unsupported_value")
        params["word_timestamps"] = True
    return params, len(pcm) / rate, served
