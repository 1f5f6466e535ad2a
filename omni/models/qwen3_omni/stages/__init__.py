"""The Qwen3-Omni stage kinds, each with its typed args (stages/args.py): the table the family's
`register(registry)` registers (`registry.register_stage`) (import-light: only `module:attr` strings)."""

_STAGES = "omni.models.qwen3_omni.stages"
KINDS = {  # kind -> (stage class, args class); graph.py names the classes, the registry knows both
    "qwen3-omni.preprocess": (f"{_STAGES}.preprocess_stage:PreprocessStage", f"{_STAGES}.args:PreprocessArgs"),
    "qwen3-omni.audio_encoder": (f"{_STAGES}.encoders:AudioEncoderStage", f"{_STAGES}.args:EncoderPartArgs"),
    "qwen3-omni.vision_encoder": (f"{_STAGES}.encoders:VisionEncoderStage", f"{_STAGES}.args:EncoderPartArgs"),
    "qwen3-omni.thinker": (f"{_STAGES}.thinker_stage:ThinkerStage", f"{_STAGES}.args:ThinkerArgs"),
    "qwen3-omni.talker": (f"{_STAGES}.talker_stage:TalkerStage", f"{_STAGES}.args:TalkerArgs"),
    "qwen3-omni.code2wav": (f"{_STAGES}.code2wav_stage:Code2WavStage", f"{_STAGES}.args:Code2WavArgs"),
}

