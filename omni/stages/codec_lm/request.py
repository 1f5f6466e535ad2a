"""A multi-codebook talker sequence's state (`CodecLMRequest`) and what it needs of its prompt
(`FramePrompt`): the prefill rows, their positions, and the text row that trails each frame.

The stage hands the request to the engine as `inputs[STATE_KEY]`; the model keeps it in
`seq.model_state[STATE_KEY]` until release.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

STATE_KEY = "codec_lm"  # the request's key in the engine's `inputs` and in `seq.model_state`


class FramePrompt(Protocol):
    """A family's prompt rows (Qwen3-Omni: built from the thinker's states; Qwen3-TTS: from text)."""

    prefill: torch.Tensor | None  # [n, H] the prefill's input rows (None until they can be built)
    positions: torch.Tensor  # [3, n] float32 (M-)RoPE positions of the prefill
    delta: float  # a frame's position = its index + delta

    def trailing(self, k: int) -> torch.Tensor | None:
        """The text row added to frame k's input; None while it has not arrived."""


@dataclass
class CodecLMRequest:
    """Per-sequence talker state, kept in `seq.model_state[STATE_KEY]` until release."""

    inputs: FramePrompt | Any
    greedy: bool
    seed: int = 0  # the code predictor's draws (the talker's own go through the engine's sampler)
    predictor_temperature: float = 1.0  # the code predictor's when the talker samples (greedy: 0)
    frame_embeds: list[torch.Tensor] = field(default_factory=list)  # per computed frame [H]

    @property
    def prefill_len(self) -> int:
        return int(self.inputs.prefill.shape[0])
