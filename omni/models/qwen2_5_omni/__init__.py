"""Qwen2.5-Omni (issue 29), its audio output end so far: token2wav (DiT + BigVGAN) under the generic
diffusion stage (omni/stages/diffusion.py). No `register` yet: without a thinker and a talker the
family would expose a model that cannot answer, so it stays importable and tested only.

config.py (the token2wav part of config.json), modules/ (DiT, ECAPA via omni/layers, BigVGAN,
Token2Wav = the diffusion stage's model), checkpoint/make_tiny.py (tiny reference checkpoints).
"""
