"""The encoder stages of a Qwen3-Omni graph: the audio tower and the vision tower, each a
`BatchEncoder` under omni's generic encoder stage."""

from __future__ import annotations

import torch

from omni.models.qwen3_omni.checkpoint.random_load import random_part
from omni.models.qwen3_omni.modules.audio_encoder import AudioEncoder, AudioFeaturesEncoder
from omni.models.qwen3_omni.modules.vision_encoder import ImagePatchesEncoder, VisionEncoder
from omni.models.qwen3_omni.stages.args import EncoderPartArgs
from omni.stages.encoder import EncoderStage


class AudioEncoderStage(EncoderStage):
    """args: `EncoderPartArgs` (stages/args.py)."""

    Args = EncoderPartArgs

    def build_encoder(self) -> AudioFeaturesEncoder:
        dtype = self.ctx.args.dtype
        model = random_part("audio_encoder", vars(self.ctx.args), self.ctx.device)  # load_format="random"
        model = model if model is not None else AudioEncoder.from_checkpoint(
            self.ctx.args.model_dir, dtype=getattr(torch, dtype) if dtype else None, device=self.ctx.device)
        return AudioFeaturesEncoder(model)


class VisionEncoderStage(EncoderStage):
    """args: `EncoderPartArgs` (stages/args.py)."""

    Args = EncoderPartArgs

    def build_encoder(self) -> ImagePatchesEncoder:
        dtype = self.ctx.args.dtype
        model = random_part("vision_encoder", vars(self.ctx.args), self.ctx.device)  # load_format="random"
        model = model if model is not None else VisionEncoder.from_checkpoint(
            self.ctx.args.model_dir, dtype=getattr(torch, dtype) if dtype else None, device=self.ctx.device)
        return ImagePatchesEncoder(model)
