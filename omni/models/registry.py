"""The model side of the registry (the kernel's holds stage kinds and families by name): what a
family's graph builder tells the API about the model it serves, beside its Graph."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# A token covers at most this many characters of ordinary text, so a prompt of more than
# max_context * CHARS_PER_TOKEN characters cannot fit: refused before it is tokenized.
CHARS_PER_TOKEN = 16


@dataclass
class ModelInfo:
    """What the API needs to know of a served model."""
    id: str
    family: str
    speaks: bool = False
    transcribes: bool = False
    voices: list[str] = field(default_factory=list)
    sample_rate: int = 24000
    random_weights: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    max_context: int | None = None  # prompt tokens the model takes; longer prompts are refused up front
    sampling_stage: str | None = None  # the stage whose sampling a request's top-level fields set (None: none)
