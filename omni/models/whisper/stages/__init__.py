"""The Whisper stage kinds, each with its typed args (stages/args.py): the table the family's
`register(registry)` registers (`registry.register_stage`) (import-light: only `module:attr` strings)."""

_STAGES = "omni.models.whisper.stages"
KINDS = {  # kind -> (stage class, args class)
    "whisper.encoder": (f"{_STAGES}.encoder_stage:WhisperEncoderStage", f"{_STAGES}.args:WhisperEncoderArgs"),
    "whisper.decoder": (f"{_STAGES}.decoder_stage:WhisperDecoderStage", f"{_STAGES}.args:WhisperDecoderArgs"),
}

