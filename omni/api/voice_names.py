"""OpenAI's voice names (alloy, ash, ... marin, cedar) on every speaking model, by one table.

A client written for OpenAI sends `voice="alloy"`; a model has speakers of its own. Each OpenAI
voice stands for the first speaker of its row that the model has (the published Qwen3-Omni and
Qwen3-TTS speakers, alike in gender and tone), else for the model's default voice (its first). A
checkpoint overrides the table with `"omni_openai_voices": {"alloy": "vivian", ...}` in its
config.json (`ModelInfo.openai_voices`). A model without named speakers: one that designs
its voice from `instructions` (Qwen3-TTS VoiceDesign) takes the row's description as its
instructions when a request sends none; one that clones voices speaks only in uploaded voices (an
upload may be named "alloy"). A speaker of the model's own always wins over the table.
"""

from __future__ import annotations

# name -> (the voice described, for a model that designs voices; speakers most alike first)
OPENAI_VOICES: dict[str, tuple[str, tuple[str, ...]]] = {
    "alloy": ("A neutral, balanced, clear voice of medium pitch.", ("chelsie", "vivian", "serena")),
    "ash": ("A warm, confident male voice.", ("ethan", "ryan", "eric")),
    "ballad": ("A soft, expressive, melodic male voice.", ("aiden", "dylan", "eric")),
    "coral": ("A bright, friendly female voice.", ("chelsie", "serena", "vivian")),
    "echo": ("A calm, resonant male voice.", ("ethan", "eric", "ryan")),
    "fable": ("A lively storyteller's voice with a British accent.", ("aiden", "dylan", "ryan")),
    "nova": ("An energetic, youthful female voice.", ("chelsie", "vivian", "sohee")),
    "onyx": ("A deep, authoritative male voice.", ("ethan", "uncle_fu", "eric")),
    "sage": ("A gentle, thoughtful female voice.", ("chelsie", "serena", "ono_anna")),
    "shimmer": ("A clear, airy, cheerful female voice.", ("chelsie", "vivian", "sohee")),
    "verse": ("A versatile, expressive male voice.", ("aiden", "ryan", "dylan")),
    "marin": ("A natural, warm, professional female voice.", ("chelsie", "serena", "vivian")),
    "cedar": ("A natural, grounded, friendly male voice.", ("ethan", "ryan", "eric")),
}


def is_openai_voice(name: str) -> bool:
    return name.strip().lower() in OPENAI_VOICES


def own_voice(info, name: str) -> str | None:
    """The model's speaker `name` means: its own (any case), else the one an OpenAI name stands for;
    None when it is neither (or the model has no named speakers)."""
    voices = list(info.voices)
    by_lower = {v.lower(): v for v in voices}
    key = name.strip().lower()
    if key in by_lower or not voices or key not in OPENAI_VOICES:
        return by_lower.get(key)
    override = {k.lower(): v for k, v in info.openai_voices.items()}
    for candidate in (override.get(key), *OPENAI_VOICES[key][1]):
        if candidate and candidate.lower() in by_lower:
            return by_lower[candidate.lower()]
    return voices[0]


def voice_description(name: str) -> str | None:
    """What an OpenAI voice sounds like, in words (None: not an OpenAI name)."""
    row = OPENAI_VOICES.get(name.strip().lower())
    return row[0] if row else None
