"""The Qwen2.5-Omni family (issue 29): its registration (kept import-light: only `module:attr` strings).

modules/ (torch: the thinker LM, audio and vision encoders, the one-codebook talker, DiT + BigVGAN
token2wav), stages/ (the stage classes: preprocess, encoders, thinker, talker, token2wav; each a subclass
of a shared one),
checkpoint/ (tiny and full-size writers), config.py, graph.build (checkpoint dir -> Graph + ModelInfo).
"""


def register(registry) -> None:
    from omni.models.qwen2_5_omni.stages import register_stages

    register_stages(registry)
    registry.register_family("qwen2.5-omni", "omni.models.qwen2_5_omni.graph:build",
                             ["Qwen2_5OmniForConditionalGeneration", "Qwen2_5OmniModel"],
                             settle="omni.models.qwen2_5_omni.graph:settle")
    registry.register_tiny("qwen2.5-omni", "omni.models.qwen2_5_omni.checkpoint.make_tiny:main")
