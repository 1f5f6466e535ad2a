"""The Qwen3-Omni family: its registration (kept import-light: only `module:attr` strings).

modules/ (torch), stages/ (the stage classes), checkpoint/ (tiny and full-size generators,
loaders, export), graph.build (checkpoint dir -> Graph + ModelInfo), request (what a request needs).
"""

from omni.layers.hf_logs import drop_warnings

# Qwen3-Omni's M-RoPE keys, which its own config reads, unknown to transformers' generic rope check
drop_warnings("transformers.modeling_rope_utils", "Unrecognized keys in `rope_parameters`")


def register(registry) -> None:
    from omni.models.qwen3_omni.stages import KINDS

    for kind, (target, args) in KINDS.items():  # the stage kinds, each with its typed args
        registry.register_stage(kind, target, args=args)
    registry.register_family("qwen3-omni", "omni.models.qwen3_omni.graph:build",
                             ["Qwen3OmniMoeForConditionalGeneration"], settle="omni.models.qwen3_omni.graph:settle")
    registry.register_tiny("qwen3-omni", "omni.models.qwen3_omni.checkpoint.make_tiny:main")
    registry.register_default("qwen3-omni", "omni.models.qwen3_omni.checkpoint.embedded:embedded_model")
