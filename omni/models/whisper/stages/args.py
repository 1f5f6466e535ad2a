"""The typed args of the Whisper stage kinds (torch-free: the kernel checks graphs against them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from omni.stages.args import EncoderArgs, StageArgs, positive


@dataclass
class WhisperEncoderArgs(EncoderArgs):
    """stages/encoder_stage.py: audio -> <= 30 s windows -> encoder outputs."""

    model_dir: str = ""  # the Whisper checkpoint directory
    dtype: str = "float32"  # weights dtype ("float16" on a GPU)
    out_port: str = "windows"
    max_audio_s: float = 600.0  # longer input audio is refused
    silence_peak: float = 1e-4  # audio whose peak is under this is silence (no windows decoded)


@dataclass
class WhisperDecoderArgs(StageArgs):
    """stages/decoder_stage.py: every window one sequence on the AR engine; the stage-level
    max_batch is `max_num_seqs`."""

    STAGE_FIELDS: ClassVar[dict[str, str]] = {"max_batch": "max_num_seqs"}

    model_dir: str = ""  # the Whisper checkpoint directory
    dtype: str = "float32"  # weights dtype ("float16" on a GPU)
    max_num_seqs: int = 32  # windows in the engine at once (each holds its cross-attention K/V)
    block_size: int = 16  # KV cache block, tokens
    num_blocks: int = 0  # KV cache blocks; 0 = room for 256 tokens a window on average
    max_num_batched_tokens: int = 2048  # tokens per engine step
    default_sampling: dict[str, Any] = field(default_factory=lambda: {"temperature": 0.0})  # under the request's

    def check(self) -> None:
        super().check()
        positive(self, "max_num_seqs", "block_size", "max_num_batched_tokens")
