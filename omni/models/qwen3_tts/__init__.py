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

STAGES = {
    "qwen3_tts_preprocess": "omni.models.qwen3_tts.stages.preprocess_stage:PreprocessStage",
    "qwen3_tts_talker": "omni.models.qwen3_tts.stages.talker_stage:TTSTalkerStage",
    "qwen3_tts_voice": "omni.models.qwen3_tts.stages.voice_stage:VoiceStage",
    "qwen3_tts_codec": "omni.models.qwen3_tts.stages.codec_stage:CodecStage",
}


def register(registry) -> None:
    """omni's family registration (the same call plugins make)."""
    for kind, target in STAGES.items():
        registry.register_stage(kind, target)
    registry.register_family("qwen3-tts", "omni.models.qwen3_tts.graph:build", ["Qwen3TTSForConditionalGeneration"],
                             tasks=["speech"])
    registry.register_tiny("qwen3-tts", "omni.models.qwen3_tts.checkpoint.make_tiny:main")
