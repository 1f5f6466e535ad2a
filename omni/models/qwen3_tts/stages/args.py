"""The typed args of the Qwen3-TTS stage kinds (torch-free: the kernel checks graphs against them)."""

from __future__ import annotations

from dataclasses import dataclass

from omni.stages.args import StageArgs, VocoderArgs, positive
from omni.stages.codec_lm.args import CodecLMArgs


@dataclass
class TTSPreprocessArgs(StageArgs):
    """stages/preprocess_stage.py: text -> the talker's prompt."""

    model_dir: str = ""  # the checkpoint (tokenizer, config)
    max_batch: int = 16  # requests tokenized per step

    def check(self) -> None:
        super().check()
        positive(self, "max_batch")


@dataclass
class TTSTalkerArgs(CodecLMArgs):
    """stages/talker_stage.py: the shared talker's args plus the code predictor's sampling."""

    predictor_temperature: float = 0.9  # the code predictor's temperature (0: greedy)
    predictor_top_k: int | None = None  # its top-k; None = the model's
    predictor_top_p: float | None = None  # its top-p; None = the model's


@dataclass
class TTSCodecArgs(VocoderArgs):
    """stages/codec_stage.py: the 12 Hz speech tokenizer's decoder under the streaming vocoder stage."""

    model_dir: str = ""  # the checkpoint; its speech_tokenizer/ folder is loaded
    dtype: str = ""  # weights dtype; "" = the decoder's default
    seed: int = 0  # random weights of a config-only tokenizer
    voice_states: int = 16  # reference-code states kept


@dataclass
class TTSVoiceArgs(StageArgs):
    """stages/voice_stage.py: a reference clip -> the speaker embedding and reference codes."""

    model_dir: str = ""  # the checkpoint (speaker encoder, speech tokenizer)
    dtype: str = ""  # accepted for --dtype; the voice stage computes in float32
    max_ref_seconds: float = 60.0  # longer reference clips are refused
    seed: int = 0  # random weights of a config-only tokenizer
    recent_clips: int = 64  # inline clips whose prompts are kept
