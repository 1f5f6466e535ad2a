"""The Qwen2.5-Omni stage kinds so far (import-light: only `module:attr` strings)."""

_STAGES = "omni.models.qwen2_5_omni.stages"
KINDS = {  # kind -> (stage class, args class)
    "qwen2.5-omni.token2wav": (f"{_STAGES}.token2wav_stage:Token2WavStage", f"{_STAGES}.args:Token2WavArgs"),
}


def register_stages(registry) -> None:
    for kind, (target, args) in KINDS.items():
        registry.register_stage(kind, target, args=args)
