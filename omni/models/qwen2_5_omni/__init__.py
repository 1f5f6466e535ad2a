"""Qwen2.5-Omni (issue 29), its audio output end so far: token2wav (DiT + BigVGAN) under the generic
diffusion stage (omni/stages/diffusion.py). `register` adds the stage kind only: without a thinker and
a talker the family would expose a model that cannot answer, so no family (nor make-tiny) yet.

config.py (the token2wav part of config.json), modules/ (DiT, ECAPA via omni/layers, BigVGAN,
Token2Wav = the diffusion stage's model), stages/ (the token2wav stage kind), checkpoint/make_tiny.py
(tiny reference checkpoints of token2wav).
"""


def register(registry) -> None:
    from omni.models.qwen2_5_omni.stages import register_stages

    register_stages(registry)
