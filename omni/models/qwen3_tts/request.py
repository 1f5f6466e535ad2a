"""What a Qwen3-TTS request says, read from kernel params, and the reference's text formats.

Params (what /v1/audio/speech sends): `input` (the text), `voice` (a named speaker for
CustomVoice; an uploaded voice for Base, resolved by the voice stage), `instructions`
(OpenAI's field: CustomVoice style / VoiceDesign's voice description), `language` ("auto" or
one of the checkpoint's), `non_streaming_text` (the reference's `non_streaming_mode`; by default
the reference's per-kind default: True for CustomVoice / VoiceDesign, False for Base).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from omni.kernel.errors import InvalidRequest

MAX_TEXT_CHARS = 4096
NON_STREAMING_DEFAULT = {"custom_voice": True, "voice_design": True, "base": False}


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def ref_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def instruct_text(instruct: str) -> str:
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


@lru_cache(maxsize=4)
def load_tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(model_dir)))


def tokenize(tokenizer, text: str) -> list[int]:
    return [int(t) for t in tokenizer(text)["input_ids"]]


def speech_text(params: dict[str, Any]) -> str:
    text = params.get("input")
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest("input (the text to speak) is missing or blank")
    if len(text) > MAX_TEXT_CHARS:
        raise InvalidRequest(f"input is {len(text)} characters; at most {MAX_TEXT_CHARS}")
    return text


def instructions_of(params: dict[str, Any]) -> str | None:
    value = params.get("instructions")
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidRequest("instructions must be a string")
    if len(value) > MAX_TEXT_CHARS:
        raise InvalidRequest(f"instructions are {len(value)} characters; at most {MAX_TEXT_CHARS}")
    return value


def non_streaming_of(params: dict[str, Any], kind: str) -> bool:
    value = params.get("non_streaming_text")
    if value is None:
        return NON_STREAMING_DEFAULT[kind]
    if not isinstance(value, bool):
        raise InvalidRequest("non_streaming_text must be a boolean")
    return value
