"""OpenAI's model names (`whisper-1`, `tts-1`, `gpt-4o-*`...) as aliases of the served model of that task.

Clients written for OpenAI send these names unchanged; each resolves to the served model that does
its task (chat, speech, transcription), and is listed in /v1/models only when such a model is served.
OpenAI's realtime names (`gpt-realtime`, `gpt-4o-realtime-preview`...) name the chat model, which is
what `/v1/realtime` talks to. Only a model with trained weights transcribes for `whisper-1` & co.
"""

from __future__ import annotations

import re

CHAT, SPEECH, TRANSCRIBE, TRANSLATE = "chat", "speech", "transcribe", "translate"

OPENAI_ALIASES: dict[str, str] = {
    "gpt-4o": CHAT,
    "gpt-4o-mini": CHAT,
    "gpt-4o-audio-preview": CHAT,
    "gpt-4o-mini-audio-preview": CHAT,
    "gpt-realtime": CHAT,
    "gpt-realtime-mini": CHAT,
    "gpt-4o-realtime-preview": CHAT,
    "gpt-4o-mini-realtime-preview": CHAT,
    "tts-1": SPEECH,
    "tts-1-hd": SPEECH,
    "gpt-4o-mini-tts": SPEECH,
    "whisper-1": TRANSCRIBE,
    "gpt-4o-transcribe": TRANSCRIBE,
    "gpt-4o-mini-transcribe": TRANSCRIBE,
}


_SNAPSHOT = re.compile(r"-\d{4}-\d{2}-\d{2}\Z")  # OpenAI's dated snapshots: gpt-4o-realtime-preview-2024-12-17


def alias_task(name: str) -> str | None:
    """The task an OpenAI model name (or a dated snapshot of one) stands for; None when it is not one."""
    return OPENAI_ALIASES.get(name) or OPENAI_ALIASES.get(_SNAPSHOT.sub("", name))


def chats(info) -> bool:
    """Whether a model answers /v1/chat/completions: a family that only speaks or transcribes says
    so in `ModelInfo.tasks` (no "chat" there), and is then never listed as a chat model."""
    return CHAT in info.tasks


def completes(info) -> bool:
    """Whether a chat model also continues raw text (/v1/completions): its family says so with
    `ModelInfo.completions` (its entry stage takes the task "complete")."""
    return chats(info) and info.completions


def translates(info) -> bool:
    """Whether a model serves /v1/audio/translations (speech in any language -> English text)."""
    return TRANSLATE in info.tasks
