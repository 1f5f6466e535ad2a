"""The typed args of the Qwen2.5-Omni stage kinds (torch-free: the kernel checks graphs against them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omni.stages.multimodal.args import EncoderPartArgs, MultimodalLMArgs, PreprocessArgs
from omni.stages.ar.args import ARArgs
from omni.stages.args import DiffusionArgs, WeightArgs

__all__ = ["EncoderPartArgs", "PreprocessArgs", "TalkerArgs", "ThinkerArgs", "Token2WavArgs"]

ThinkerArgs = MultimodalLMArgs  # the thinker takes the shared multimodal LM stage's args as they are


@dataclass
class Token2WavArgs(WeightArgs, DiffusionArgs):
    """stages/token2wav_stage.py: token2wav (DiT + BigVGAN) under the generic diffusion stage."""


@dataclass
class TalkerArgs(WeightArgs, ARArgs):
    """stages/talker_stage.py: the one-codebook talker on the AR engine."""

    speaker: str = ""  # the voice when a request names none ("": the checkpoint's first)
    model: Any = None  # in-process only: a built Qwen2_5OmniTalker instead of model_dir
