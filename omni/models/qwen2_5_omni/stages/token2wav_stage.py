"""The token2wav stage of a Qwen2.5-Omni graph: the DiT + BigVGAN under omni's diffusion stage."""

from __future__ import annotations

from functools import partial

from omni.layers.fused_linear import fuse_model_projections
from omni.models.loading import load_part
from omni.models.qwen2_5_omni.checkpoint.random_load import random_part
from omni.models.qwen2_5_omni.modules.token2wav import Token2Wav
from omni.models.qwen2_5_omni.stages.args import Token2WavArgs
from omni.stages.diffusion import DiffusionStage


class Token2WavStage(DiffusionStage):
    """args: `Token2WavArgs`; codes in on `codes`, PCM out (fp32: the reference runs token2wav in fp32)."""

    Args = Token2WavArgs

    def build_model(self) -> Token2Wav:
        model = load_part(Token2Wav, vars(self.ctx.args), self.ctx.device,
                          random=partial(random_part, "token2wav"), default_dtype="float32")
        if self.ctx.args.dit_dtype:
            import torch

            model.code2wav_dit_model.to(getattr(torch, self.ctx.args.dit_dtype))
        fuse_model_projections(model)  # on CUDA: q/k/v and the modulations, one GEMM each
        return model
