"""`load_format="random"`: build a Qwen3-Omni part on the meta device and draw its weights directly
on the target device (no checkpoint on disk, no host copy), same shapes, dtype and bytes as
the real model. For benchmarks at full size (see `presets_full`), and for tests.

Parameters: N(0, std) from one generator seeded by `seed` on the target device, in
parameter-name order (omni/layers/random_init.py); norm weights are 1 and biases 0 so activations
stay in range through 48 layers. Non-parameter tensors (rotary `inv_freq`, sinusoid tables, code
offsets, the talker's tts rows) are recomputed after `to_empty`, which leaves them uninitialised.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from omni.layers.fp8 import device_runs_fp8
from omni.layers.fp8_format import checkpoint_format, requested
from omni.layers.fp8_modules import quantize_
from omni.layers.random_init import DEFAULT_STD, randomized
from omni.layers.rotary import rope_inv_freq
from omni.models.loading import arg, random_dir
from omni.models.weights import CheckpointError


def random_thinker(cfg, device="cpu", dtype=torch.bfloat16, seed: int = 0, std: float = DEFAULT_STD):
    """`Qwen3OmniThinker` (text model + lm_head) of `cfg` (a ThinkerConfig) with random weights."""
    from omni.models.qwen3_omni.modules.thinker import Qwen3OmniThinker

    with randomized(lambda: Qwen3OmniThinker(cfg, dtype), device, dtype, seed, std) as model:
        model.inv_freq = rope_inv_freq(cfg.text.head_dim, cfg.text.rope_theta).to(device)
    return model


def random_talker(cfg, device="cpu", dtype=torch.bfloat16, seed: int = 0, std: float = DEFAULT_STD):
    """`TalkerModel` (+ code predictor) of `cfg` (a Qwen3OmniConfig); the tts rows come from random
    thinker embedding rows through the (random) text projection, as a real load computes them."""
    from omni.models.qwen3_omni.modules.talker import TalkerModel

    t = cfg.talker
    with randomized(lambda: TalkerModel(cfg), device, dtype, seed, std) as model:
        model.inv_freq = rope_inv_freq(t.text.head_dim, t.text.rope_theta).to(device)
        model.code_predictor.inv_freq = rope_inv_freq(t.code_predictor.head_dim, t.code_predictor.rope_theta).to(device)
        gen = torch.Generator(device=device).manual_seed(int(seed) + 1)
        rows = torch.randn(3, t.thinker_hidden_size, generator=gen, device=device, dtype=torch.float32) * std
        model.tts_embeds.copy_(model.text_projection(rows.to(model.tts_embeds.dtype)))
    return model


def random_code2wav(cfg, device="cpu", dtype=torch.bfloat16, seed: int = 0, std: float = DEFAULT_STD):
    """`Code2Wav` of `cfg` (a Code2WavConfig)."""
    from omni.models.qwen3_omni.modules.code2wav import Code2Wav

    with randomized(lambda: Code2Wav(cfg), device, dtype, seed, std) as model:
        model.code_offset = (torch.arange(cfg.num_quantizers, device=device).view(1, -1, 1) * cfg.codebook_size)
        model.pre_transformer.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, device)
    return model


def random_audio_encoder(cfg, device="cpu", dtype=torch.bfloat16, seed: int = 0, std: float = DEFAULT_STD):
    """`AudioEncoder` of `cfg` (an AudioEncoderConfig)."""
    from omni.layers.transformer import sinusoids
    from omni.models.qwen3_omni.modules.audio_encoder import AudioEncoder

    with randomized(lambda: AudioEncoder(cfg), device, dtype, seed, std) as model:
        model.positions = sinusoids(cfg.max_source_positions, cfg.d_model).to(device)  # float32, as a real load
    return model


def random_vision_encoder(cfg, device="cpu", dtype=torch.bfloat16, seed: int = 0, std: float = DEFAULT_STD):
    """`VisionEncoder` of `cfg` (a VisionEncoderConfig)."""
    from omni.models.qwen3_omni.modules.vision_encoder import VisionEncoder, vision_inv_freq

    with randomized(lambda: VisionEncoder(cfg), device, dtype, seed, std) as model:
        model.inv_freq = vision_inv_freq(cfg, device)
    return model


_BUILDERS = {
    "thinker": lambda c: (random_thinker, c.thinker),
    "talker": lambda c: (random_talker, c),
    "code2wav": lambda c: (random_code2wav, c.code2wav),
    "audio_encoder": lambda c: (random_audio_encoder, c.thinker.audio),
    "vision_encoder": lambda c: (random_vision_encoder, c.thinker.vision),
}


def random_part(part: str, args: Any, device) -> nn.Module | None:
    """The stage's model with random weights when its args say `load_format="random"`, else None.

    Reads the config from `args["model_dir"]` (or `args["model"]`); `dtype` defaults to bfloat16
    (the published weights' dtype); `seed` (default 0) picks the weights. A thinker or talker is
    quantized to FP8 when the config declares it (`quantization_config`) or the args ask for it.
    """
    where = random_dir(part, args)
    if where is None:
        return None
    from omni.models.qwen3_omni.config import load_config

    cfg = load_config(where)
    if part not in ("thinker", "audio_encoder", "vision_encoder") and cfg.talker is None:
        raise CheckpointError(f"{where} has no audio output, so no {part}")
    build, sub = _BUILDERS[part](cfg)
    dtype = getattr(torch, arg(args, "dtype") or "bfloat16")
    model = build(sub, device=device, dtype=dtype, seed=int(arg(args, "seed") or 0) + list(_BUILDERS).index(part))
    if part in ("thinker", "talker"):
        fmt = checkpoint_format(cfg.raw) or requested(arg(args, "quantization"))
        if fmt is not None:  # an FP8 random model dir (`presets_full --fp8`) or quantization="fp8"
            quantize_(model, fmt, keep_fp8=device_runs_fp8(device))
    return model
