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

    dit_dtype: str = ""  # the DiT's (and its speaker encoder's) dtype ("": the stage's, float32); the ODE's
    # state and BigVGAN stay in the stage's dtype. The graph sets the server's --dtype here on CUDA.

    def check(self) -> None:
        super().check()
        if self.dit_dtype not in ("", "float32", "bfloat16", "float16"):
            raise ValueError(f"dit_dtype must be float32, bfloat16 or float16, got {self.dit_dtype!r}")


@dataclass
class TalkerArgs(WeightArgs, ARArgs):
    """stages/talker_stage.py: the one-codebook talker on the AR engine."""

    speaker: str = ""  # the voice when a request names none ("": the checkpoint's first)
    model: Any = None  # in-process only: a built Qwen2_5OmniTalker instead of model_dir
