"""The Qwen2.5-Omni stage kinds, each with its typed args (import-light: only `module:attr` strings)."""

_STAGES = "omni.models.qwen2_5_omni.stages"
KINDS = {  # kind -> (stage class, args class)
    "qwen2.5-omni.preprocess": (f"{_STAGES}.preprocess_stage:PreprocessStage", f"{_STAGES}.args:PreprocessArgs"),
    "qwen2.5-omni.audio_encoder": (f"{_STAGES}.encoders:AudioEncoderStage", f"{_STAGES}.args:EncoderPartArgs"),
    "qwen2.5-omni.vision_encoder": (f"{_STAGES}.encoders:VisionEncoderStage", f"{_STAGES}.args:EncoderPartArgs"),
    "qwen2.5-omni.thinker": (f"{_STAGES}.thinker_stage:ThinkerStage", f"{_STAGES}.args:ThinkerArgs"),
    "qwen2.5-omni.talker": (f"{_STAGES}.talker_stage:TalkerStage", f"{_STAGES}.args:TalkerArgs"),
    "qwen2.5-omni.token2wav": (f"{_STAGES}.token2wav_stage:Token2WavStage", f"{_STAGES}.args:Token2WavArgs"),
}


def register_stages(registry) -> None:
    for kind, (target, args) in KINDS.items():
        registry.register_stage(kind, target, args=args)
