"""OpenAI's model names (`whisper-1`, `tts-1`, `gpt-4o-*`...) as aliases of the served model of that task.

Clients written for OpenAI send these names unchanged; each resolves to the served model that does
its task (chat, speech, transcription), and is listed in /v1/models only when such a model is served.
"""

from __future__ import annotations

CHAT, SPEECH, TRANSCRIBE, TRANSLATE = "chat", "speech", "transcribe", "translate"

OPENAI_ALIASES: dict[str, str] = {
    "gpt-4o": CHAT,
    "gpt-4o-mini": CHAT,
    "gpt-4o-audio-preview": CHAT,
    "gpt-4o-mini-audio-preview": CHAT,
    "tts-1": SPEECH,
    "tts-1-hd": SPEECH,
    "gpt-4o-mini-tts": SPEECH,
    "whisper-1": TRANSCRIBE,
    "gpt-4o-transcribe": TRANSCRIBE,
    "gpt-4o-mini-transcribe": TRANSCRIBE,
}


def alias_task(name: str) -> str | None:
    """The task an OpenAI model name stands for, or None when it is not one of OpenAI's names."""
    return OPENAI_ALIASES.get(name)


def chats(info) -> bool:
    """Whether a model answers /v1/chat/completions (a family that only transcribes says so in
    `ModelInfo.extra["tasks"]`)."""
    return CHAT in info.extra.get("tasks", (CHAT,))


def translates(info) -> bool:
    """Whether a model serves /v1/audio/translations (speech in any language -> English text)."""
    return TRANSLATE in info.extra.get("tasks", ())
