"""Qwen3-TTS (the `qwen-tts` reference's `Qwen3TTSForConditionalGeneration`): CustomVoice, VoiceDesign
and Base (voice cloning) checkpoints with the 12 Hz speech tokenizer.

Model side: `config` (config.json, strict), `request` (params and the reference's text formats),
`modules/prompt` (the talker prompt per kind, as the reference builds it), `modules/talker`
(Qwen3-Omni's talker and code predictor, dense), `stages/preprocess_stage`, `stages/talker_stage`,
`checkpoint/make_tiny` + `checkpoint/presets` (random checkpoints: two tiny sizes and the
published 1.7B), `graph`. Audio side: the speech tokenizer, the speaker encoder, the voice and
codec stages, the voices store.

How it compares with the reference: greedy codes are the same for every kind and text mode
(tests/test_qwen3_tts_model.py); sampled codes draw from omni's one sampler (same filters, other noise).
"""

from __future__ import annotations

from omni.layers.hf_logs import drop_warnings

# its config read through a base class that has no model type: harmless
drop_warnings("transformers.configuration_utils",
              "You are using a model of type `qwen3_tts` to instantiate a model of type ``")

_STAGES = "omni.models.qwen3_tts.stages"
STAGES = {  # kind -> (stage class, its typed args: stages/args.py)
    "qwen3-tts.preprocess": (f"{_STAGES}.preprocess_stage:PreprocessStage", f"{_STAGES}.args:TTSPreprocessArgs"),
    "qwen3-tts.talker": (f"{_STAGES}.talker_stage:TTSTalkerStage", f"{_STAGES}.args:TTSTalkerArgs"),
    "qwen3-tts.voice": (f"{_STAGES}.voice_stage:VoiceStage", f"{_STAGES}.args:TTSVoiceArgs"),
    "qwen3-tts.codec": (f"{_STAGES}.codec_stage:CodecStage", f"{_STAGES}.args:TTSCodecArgs"),
}


ALIASES = {kind: kind.replace("-", "_").replace(".", "_") for kind in STAGES}  # the former names: qwen3_tts_talker


def register(registry) -> None:
    """omni's family registration (the same call plugins make)."""
    for kind, (target, args) in STAGES.items():
        registry.register_stage(kind, target, args=args, aliases=(ALIASES[kind],))
    registry.register_family("qwen3-tts", "omni.models.qwen3_tts.graph:build", ["Qwen3TTSForConditionalGeneration"],
                             tasks=["speech"])
    registry.register_tiny("qwen3-tts", "omni.models.qwen3_tts.checkpoint.make_tiny:main")
