"""A Realtime session's settings: parsed from `session.update` (and `response.create` overrides) in
either of OpenAI's two shapes, the beta one (`modalities`, `input_audio_format`, `turn_detection`...)
and the GA one (`output_modalities`, `audio.input.format`, `audio.input.turn_detection`...), and
rendered back in the shape of the connection's dialect.

Only 24 kHz mono pcm16 travels in either direction (what OpenAI's `pcm16` / `audio/pcm` is).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import msgspec

from omni.api.errors import ApiError, bad_request
from omni.api.params import check_model, resolve_voice, stage_sampling
from omni.api.schemas import StageSampling, decode_body
from omni.api.realtime.turn_end import EAGERNESS, server_early_ms
from omni.api.realtime.vad import VadSettings

if TYPE_CHECKING:
    from omni.api.state import ServerState

PCM_RATE = 24000
_BETA_FORMATS = ("pcm16",)
_GA_FORMATS = ("audio/pcm",)


@dataclass
class TurnDetection:
    """`server_vad` (silero with the client's threshold and waits; omni's `early_silence_ms` extension
    sets the early rule's window, by default turn_end.server_early_ms, 0 turns it off) or
    `semantic_vad` (its `eagerness` picks the early window and the maximum wait: turn_end.EAGERNESS)."""

    vad: VadSettings = field(default_factory=lambda: VadSettings(early_ms=server_early_ms(500)))
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: str | None = None  # set for semantic_vad

    def render(self) -> dict:
        flags = {"create_response": self.create_response, "interrupt_response": self.interrupt_response}
        if self.eagerness is not None:
            return {"type": "semantic_vad", "eagerness": self.eagerness, **flags}
        return {"type": "server_vad", "threshold": self.vad.threshold,
                "prefix_padding_ms": self.vad.prefix_padding_ms,
                "silence_duration_ms": self.vad.silence_duration_ms, "early_silence_ms": self.vad.early_ms, **flags}


@dataclass
class SessionConfig:
    model: str
    voice: str | None
    modalities: list[str]  # "text" always; "audio" when answers are spoken (the text is then its transcript)
    instructions: str = ""
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    transcribe_input: bool = False  # also transcribe the user's audio turns (input_audio_transcription)
    transcription: dict = field(default_factory=dict)  # its language and prompt
    temperature: float | None = None
    max_output_tokens: int | None = None  # None: the model's own default length
    stage_sampling: dict[str, StageSampling] | None = None  # omni's extension, as in the chat route
    model_max_tokens: int | None = None  # the model's own default length (None: it says none)

    @classmethod
    def default(cls, state: ServerState, model: str) -> SessionConfig:
        speaks = state.info.speaks
        return cls(model, resolve_voice(state, None, "session.voice") if speaks else None,
                   ["text", "audio"] if speaks else ["text"], model_max_tokens=default_max_tokens(state.info))

    # ---- parsing ---------------------------------------------------------------------------

    def updated(self, state: ServerState, body: Any, where: str = "session") -> SessionConfig:
        """A copy with `body`'s fields applied; a 400-style ApiError names the first bad field."""
        body = _obj(body, where)
        new = replace(self)
        if body.get("tools"):
            raise bad_request("tools are not supported by this server", param=f"{where}.tools",
                              code="unsupported_parameter")
        if "model" in body:
            name = _str(body["model"], f"{where}.model")
            check_model(state, name, f"{where}.model")
            new.model = name
        if "instructions" in body:
            new.instructions = _str(body["instructions"] or "", f"{where}.instructions")
        for key in ("modalities", "output_modalities"):
            if key in body:
                new.modalities = _modalities(state, body[key], f"{where}.{key}")
        audio = _obj(body.get("audio") or {}, f"{where}.audio")
        audio_in = _obj(audio.get("input") or {}, f"{where}.audio.input")
        audio_out = _obj(audio.get("output") or {}, f"{where}.audio.output")
        for key, value in (("input_audio_format", body.get("input_audio_format")),
                           ("output_audio_format", body.get("output_audio_format"))):
            if value is not None and value not in _BETA_FORMATS:
                raise bad_request(f"{where}.{key} {value!r} is not served; only 'pcm16' (24 kHz mono)",
                                  param=f"{where}.{key}", code="unsupported_audio_format")
        for name, part in (("input", audio_in), ("output", audio_out)):
            if part.get("format") is not None:
                _ga_format(part["format"], f"{where}.audio.{name}.format")
        voice = audio_out.get("voice", body.get("voice"))
        if voice is not None:
            if not state.info.speaks:
                raise bad_request(f"model {state.info.id!r} does not speak", param=f"{where}.voice",
                                  code="audio_not_supported")
            new.voice = resolve_voice(state, _str(voice, f"{where}.voice"), f"{where}.voice")
        detect_key = "turn_detection" if "turn_detection" in body else None
        if "turn_detection" in audio_in:
            detect_key, detect = "audio.input.turn_detection", audio_in["turn_detection"]
        elif detect_key:
            detect = body["turn_detection"]
        if detect_key:
            new.turn_detection = _turn_detection(detect, self.turn_detection, f"{where}.{detect_key}")
        for key, value in (("input_audio_transcription", body.get("input_audio_transcription", ...)),
                           ("audio.input.transcription", audio_in.get("transcription", ...))):
            if value is not ...:
                if value is not None:
                    value = _obj(value, f"{where}.{key}")
                    new.transcription = {k: _str(value[k], f"{where}.{key}.{k}") for k in ("language", "prompt")
                                         if value.get(k) is not None}
                new.transcribe_input = value is not None
        if body.get("temperature") is not None:
            new.temperature = _number(body["temperature"], f"{where}.temperature", 0.0, 2.0)
        if "stage_sampling" in body:
            new.stage_sampling = _stage_sampling(state, body["stage_sampling"], f"{where}.stage_sampling")
        for key in ("max_response_output_tokens", "max_output_tokens"):
            if key in body:
                new.max_output_tokens = _max_tokens(body[key], f"{where}.{key}")
        return new

    # ---- rendering -------------------------------------------------------------------------

    def max_tokens(self) -> int | str:
        """The longest answer in tokens, as it really is: the session's, else the model's own default
        (a tiny random model stops at 64), "inf" only when neither bounds it."""
        return self.max_output_tokens or self.model_max_tokens or "inf"

    def render(self, beta: bool, session_id: str) -> dict:
        detect = self.turn_detection.render() if self.turn_detection else None
        transcription = {"model": "whisper-1", **self.transcription} if self.transcribe_input else None
        max_tokens = self.max_tokens()
        common = {"id": session_id, "object": "realtime.session", "model": self.model,
                  "instructions": self.instructions, "tools": [], "tool_choice": "auto"}
        if beta:
            return {**common, "modalities": list(self.modalities), "voice": self.voice,
                    "input_audio_format": "pcm16", "output_audio_format": "pcm16",
                    "input_audio_transcription": transcription, "turn_detection": detect,
                    "temperature": self.temperature if self.temperature is not None else 0.8,
                    "max_response_output_tokens": max_tokens, "speed": 1.0}
        fmt = {"type": "audio/pcm", "rate": PCM_RATE}
        return {**common, "type": "realtime", "output_modalities": ga_modalities(self.modalities),
                "audio": {"input": {"format": fmt, "transcription": transcription, "noise_reduction": None,
                                    "turn_detection": detect},
                          "output": {"format": fmt, "voice": self.voice, "speed": 1.0}},
                "max_output_tokens": max_tokens, "tracing": None, "truncation": "auto", "prompt": None,
                "include": None}


def default_max_tokens(info) -> int | None:
    """The answer length a model stops at when a request sets none (`ModelInfo.default_max_tokens`)."""
    return info.default_max_tokens or None


def ga_modalities(modalities: list[str]) -> list[str]:
    """GA names one output modality: audio (which comes with its transcript) or text."""
    return ["audio"] if "audio" in modalities else ["text"]


def _modalities(state: ServerState, value: Any, param: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(v in ("text", "audio") for v in value):
        raise bad_request(f"{param} must be a non-empty list of 'text' and 'audio'", param=param,
                          code="invalid_value")
    if "audio" in value:
        if not state.info.speaks:
            raise bad_request(f"model {state.info.id!r} does not produce audio; use ['text']", param=param,
                              code="audio_not_supported")
        return ["text", "audio"]
    return ["text"]


def _turn_detection(value: Any, current: TurnDetection | None, param: str) -> TurnDetection | None:
    if value is None:
        return None
    value = _obj(value, param)
    kind = value.get("type", "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise bad_request(f"{param}.type {kind!r} is not served; use 'server_vad', 'semantic_vad' or null",
                          param=f"{param}.type", code="unsupported_turn_detection")
    base = current or TurnDetection()
    flags = (_bool(value.get("create_response", base.create_response), f"{param}.create_response"),
             _bool(value.get("interrupt_response", base.interrupt_response), f"{param}.interrupt_response"))
    if kind == "semantic_vad":
        eagerness = value.get("eagerness", base.eagerness or "auto")
        if eagerness not in EAGERNESS:
            raise bad_request(f"{param}.eagerness {eagerness!r} is not one of 'low', 'medium', 'high', 'auto'",
                              param=f"{param}.eagerness", code="invalid_value")
        early_ms, max_ms = EAGERNESS[eagerness]
        return TurnDetection(VadSettings(silence_duration_ms=max_ms, early_ms=early_ms), *flags, eagerness=eagerness)
    old = base.vad if base.eagerness is None else TurnDetection().vad  # from semantic_vad: server_vad's defaults
    silence = int(_number(value.get("silence_duration_ms", old.silence_duration_ms), f"{param}.silence_duration_ms",
                          0, 10_000))
    early = value.get("early_silence_ms", server_early_ms(silence) if "silence_duration_ms" in value else old.early_ms)
    vad = VadSettings(
        threshold=_number(value.get("threshold", old.threshold), f"{param}.threshold", 0.0, 1.0),
        prefix_padding_ms=int(_number(value.get("prefix_padding_ms", old.prefix_padding_ms),
                                      f"{param}.prefix_padding_ms", 0, 10_000)),
        silence_duration_ms=silence, early_ms=int(_number(early, f"{param}.early_silence_ms", 0, 10_000)))
    return TurnDetection(vad, *flags)


def _stage_sampling(state: ServerState, value: Any, param: str) -> dict[str, StageSampling] | None:
    if value is None:
        return None
    value = _obj(value, param)
    try:
        out = {name: decode_body(msgspec.json.encode(fields), StageSampling) for name, fields in value.items()}
    except ApiError as err:  # its param is inside one stage's fields: named from the session's root
        raise bad_request(f"{param}: {err.message}", param=param, code=err.code) from None
    stage_sampling(state, {}, out)  # unknown stage names are refused here
    return out


def _ga_format(value: Any, param: str) -> None:
    value = _obj(value, param)
    if value.get("type") not in _GA_FORMATS or value.get("rate", PCM_RATE) != PCM_RATE:
        got = {k: value[k] for k in ("type", "rate") if k in value}
        raise bad_request(f"{param} {got} is not served; only {{'type': 'audio/pcm', 'rate': 24000}}", param=param,
                          code="unsupported_audio_format")


def _max_tokens(value: Any, param: str) -> int | None:
    if value in (None, "inf"):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise bad_request(f"{param} must be an integer from 1 to 1000000 or 'inf'", param=param, code="invalid_value")
    return value


def _obj(value: Any, param: str) -> dict:
    if not isinstance(value, dict):
        raise bad_request(f"{param} must be an object", param=param, code="invalid_type")
    return value


def _str(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise bad_request(f"{param} must be a string", param=param, code="invalid_type")
    return value


def _bool(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        raise bad_request(f"{param} must be true or false", param=param, code="invalid_type")
    return value


def _number(value: Any, param: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise bad_request(f"{param} must be a number from {lo:g} to {hi:g}", param=param, code="invalid_value")
    return float(value)
