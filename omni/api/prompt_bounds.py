"""The cheap bound on a prompt's length: more characters than the model's context could hold as
tokens is a 400 before anything is decoded, submitted or tokenized (the entry stage then checks
the token count itself)."""

from __future__ import annotations

from omni.api.errors import bad_request
from omni.api.schemas import ChatCompletionRequest, TextPart
from omni.models.registry import CHARS_PER_TOKEN, ModelInfo


def chat_chars(req: ChatCompletionRequest) -> int:
    total = 0
    for msg in req.messages:
        if isinstance(msg.content, str):
            total += len(msg.content)
        elif msg.content:
            total += sum(len(p.text) for p in msg.content if isinstance(p, TextPart))
    return total


def check_prompt_chars(info: ModelInfo, chars: int, param: str = "messages") -> None:
    if info.max_context and chars > info.max_context * CHARS_PER_TOKEN:
        raise bad_request(f"the prompt has {chars} characters: more than this model's context of "
                          f"{info.max_context} tokens can hold", param=param, code="context_length_exceeded")
