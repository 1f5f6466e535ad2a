"""The typed args of a multi-codebook talker stage (torch-free: the kernel checks graphs against
them); each family's talker kind takes these, or a subclass that adds its own fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omni.stages.ar.args import ARArgs
from omni.stages.args import LayerArgs, WeightArgs


@dataclass
class CodecLMArgs(WeightArgs, LayerArgs, ARArgs):
    """stages/codec_lm/stage.py and the families' subclasses."""

    model: Any = None  # in-process only: a built model instead of model_dir
    speaker: str = ""  # the voice of requests that name none; "" = the model's default
