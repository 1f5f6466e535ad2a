"""The typed args of the Qwen2.5-Omni stage kinds (torch-free: the kernel checks graphs against them)."""

from __future__ import annotations

from dataclasses import dataclass

from omni.models.omni_args import EncoderPartArgs, PreprocessArgs, ThinkerArgs
from omni.stages.args import DiffusionArgs, WeightArgs

__all__ = ["EncoderPartArgs", "PreprocessArgs", "ThinkerArgs", "Token2WavArgs"]


@dataclass
class Token2WavArgs(WeightArgs, DiffusionArgs):
    """stages/token2wav_stage.py: token2wav (DiT + BigVGAN) under the generic diffusion stage."""
