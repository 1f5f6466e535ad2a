"""omni-piper: Piper VITS voices (ONNX, onnxruntime) as an omni model family.

omni calls `register(registry)` at startup through the `omni.plugins` entry point. Its stage kinds
declare no args class (`register_stage(..., args=)`): they take free-form dict args, which omni
passes on unchecked (`ctx.args` is the dict; see the README for the keys each stage reads).
"""

from __future__ import annotations


def register(registry) -> None:
    registry.register_stage("piper.text", "omni_piper.stages:SentenceStage")
    registry.register_stage("piper.synth", "omni_piper.stages:SynthStage")
    registry.register_stage("piper.resample", "omni_piper.stages:ResampleStage")
    registry.register_family("piper", "omni_piper.family:build", tasks=["speech"], voices=["joe"])
