"""The typed args the omni families' stages share (torch-free: the kernel checks graphs against them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omni.stages.ar.args import ARArgs
from omni.stages.args import EncoderArgs, LayerArgs, StageArgs, WeightArgs


@dataclass
class PreprocessArgs(StageArgs):
    """preprocess_stage.py: chat template, tokenizer, media features."""

    model_dir: str = ""  # the checkpoint directory (tokenizer, processor config)
    voices: list[str] = field(default_factory=list)  # the talker's speakers; empty: the graph makes no audio
    max_batch: int = 8  # requests prepared per step
    max_prompt_tokens: int = 0  # the thinker's context: longer prompts are refused up front; 0 = unbounded


@dataclass
class EncoderPartArgs(WeightArgs, EncoderArgs):
    """An omni family's audio or vision tower under the generic encoder stage."""


@dataclass
class MultimodalLMArgs(WeightArgs, LayerArgs, ARArgs):
    """lm_stage.py; eos_token_ids / tap_layers left empty come from the checkpoint."""

    model: Any = None  # in-process only: a built thinker instead of model_dir
