"""The typed args of the Qwen3-Omni stage kinds (torch-free: the kernel checks graphs against them)."""

from __future__ import annotations

from dataclasses import dataclass

from omni.layers.fp8_format import METHODS as QUANTIZATIONS
from omni.stages.multimodal.args import EncoderPartArgs, PreprocessArgs
from omni.stages.multimodal.args import MultimodalLMArgs
from omni.stages.args import VocoderArgs, WeightArgs
from omni.stages.codec_lm.args import CodecLMArgs


@dataclass
class Code2WavArgs(WeightArgs, VocoderArgs):
    """stages/code2wav_stage.py: code2wav under the generic streaming vocoder stage."""


@dataclass
class ThinkerArgs(MultimodalLMArgs):
    """stages/thinker_stage.py; `model`: a built Qwen3OmniThinker (in-process)."""

    sglang_export_dir: str = ""  # where backend "sglang" exports the text model; "" = the cache dir
    quantization: str = ""  # "fp8": quantize a bf16 checkpoint at load (omni/layers/fp8.py); "" = the checkpoint's

    def check(self) -> None:
        super().check()
        _check_quantization(self.quantization)


@dataclass
class TalkerArgs(CodecLMArgs):
    """stages/talker_stage.py: the shared multi-codebook talker's args (`model`: a built TalkerModel)."""

    quantization: str = ""  # as ThinkerArgs.quantization (the talker's decoder; its code predictor stays bf16)
    # on CUDA, every stream's fed text rows projected in one GEMM a step (DeferredRows). Off: measured slower on
    # the H200 (2026-12-04 call3, Qwen3-Omni c=16: TTFA 1,470 ms / RTF 0.389 on vs 439 ms / 0.183 off; bench/RESULTS.md)
    batch_text_rows: bool = False

    def check(self) -> None:
        super().check()
        _check_quantization(self.quantization)


def _check_quantization(value: str) -> None:
    if value and value not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS} or '', got {value!r}")


__all__ = ["Code2WavArgs", "EncoderPartArgs", "PreprocessArgs", "TalkerArgs", "ThinkerArgs"]
