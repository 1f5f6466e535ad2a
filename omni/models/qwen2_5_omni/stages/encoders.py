"""The encoder stages of a Qwen2.5-Omni graph: the audio tower and the vision tower, each a
`BatchEncoder` under omni's generic encoder stage."""

from __future__ import annotations

from functools import partial

from omni.models.loading import load_part
from omni.models.qwen2_5_omni.checkpoint.random_load import random_part
from omni.models.qwen2_5_omni.modules.audio_encoder import AudioEncoder, AudioFeaturesEncoder
from omni.models.qwen2_5_omni.modules.vision_encoder import ImagePatchesEncoder, VisionEncoder
from omni.models.qwen2_5_omni.stages.args import EncoderPartArgs
from omni.stages.encoder import EncoderStage


class AudioEncoderStage(EncoderStage):
    Args = EncoderPartArgs

    def build_encoder(self) -> AudioFeaturesEncoder:
        return AudioFeaturesEncoder(load_part(AudioEncoder, self.ctx.args, self.ctx.device,
                                              random=partial(random_part, "audio_encoder")))


class VisionEncoderStage(EncoderStage):
    Args = EncoderPartArgs

    def build_encoder(self) -> ImagePatchesEncoder:
        return ImagePatchesEncoder(load_part(VisionEncoder, self.ctx.args, self.ctx.device,
                                              random=partial(random_part, "vision_encoder")))
