"""`load_format="random"`: a Qwen2.5-Omni part built on the meta device with its weights drawn
directly on the stage's device (omni/layers/random_init.py): no checkpoint, no host copy, the
shapes and bytes of the real model. What serves a config-only directory (`make_tiny --preset
full-7b`, or `--config-only` at a tiny shape) for benchmarks and tests.

The language models and encoders draw N(0, 0.02) with norms 1 and biases 0 (finite through 28
layers). Token2wav draws as make_tiny's does, by fan-in, so the DiT's velocity stays finite; then
its vocoder's output convolution (no bias: the PCM is linear in it) is scaled so a probe mel comes
out at `PCM_RMS`, audible and not clipped flat at any shape. The talker's text rows (the thinker's
embeddings of text eos, pad and the speakers' bos tokens, read from a checkpoint by a real load) are
drawn as the thinker's embeddings are. Non-parameter tensors (rotary tables, sinusoids, the
vocoder's filters) are recomputed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from omni.layers.random_init import DEFAULT_STD, fan_in_randomize_, randomized
from omni.layers.rotary import rope_inv_freq
from omni.models.loading import arg, random_dir
from omni.models.weights import CheckpointError

PCM_RMS = 0.1  # the random vocoder's output level on a probe mel (its samples clip at +-1)
CODEC_EMBED = "codec_embed.weight"  # token2wav's code embeddings: unit scale (fan-in 1)


def random_thinker(cfg, device="cpu", dtype=torch.float32, seed: int = 0, std: float = DEFAULT_STD):
    """`Qwen2_5OmniThinker` of `cfg` (a ThinkerConfig); tied embeddings stay tied."""
    from omni.models.qwen2_5_omni.modules.thinker import Qwen2_5OmniThinker

    with randomized(lambda: Qwen2_5OmniThinker(cfg, dtype), device, dtype, seed, std) as model:
        model.inv_freq = rope_inv_freq(cfg.text.head_dim, cfg.text.rope_theta)  # float32 on the host, as a real load
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
    return model


def random_talker(cfg, speakers: dict[str, int], device="cpu", dtype=torch.float32, seed: int = 0,
                  std: float = DEFAULT_STD):
    """`Qwen2_5OmniTalker` of `cfg` (a Qwen2_5OmniConfig) with `speakers` {name: bos token}."""
    from omni.models.qwen2_5_omni.modules.talker import Qwen2_5OmniTalker

    tk = cfg.talker
    if tk is None:
        raise CheckpointError("the config has no talker (no audio output)")
    ids = sorted({tk.text_eos_id, tk.text_pad_id, *speakers.values()})
    gen = torch.Generator(device=device).manual_seed(int(seed) + 1)
    rows = torch.randn(len(ids), tk.embedding_size, generator=gen, device=device) * std
    with randomized(lambda: Qwen2_5OmniTalker(cfg, dict(zip(ids, rows)), speakers, dtype), device, dtype, seed,
                    std) as model:
        model.text_rows = rows.to(dtype)
        model.inv_freq = rope_inv_freq(tk.text.head_dim, tk.text.rope_theta)
    return model


def random_audio_encoder(cfg, device="cpu", dtype=torch.float32, seed: int = 0, std: float = DEFAULT_STD):
    """`AudioEncoder` of `cfg` (an AudioEncoderConfig)."""
    from omni.layers.transformer import sinusoids
    from omni.models.qwen2_5_omni.modules.audio_encoder import AudioEncoder

    with randomized(lambda: AudioEncoder(cfg), device, dtype, seed, std) as model:
        model.positions = sinusoids(cfg.max_source_positions, cfg.d_model).to(device)
    return model


def random_vision_encoder(cfg, device="cpu", dtype=torch.float32, seed: int = 0, std: float = DEFAULT_STD):
    """`VisionEncoder` of `cfg` (a VisionEncoderConfig)."""
    from omni.models.qwen2_5_omni.modules.vision_encoder import VisionEncoder

    with randomized(lambda: VisionEncoder(cfg), device, dtype, seed, std) as model:
        model.inv_freq = rope_inv_freq(cfg.hidden_size // cfg.num_heads // 2, cfg.rope_theta).to(device)
    return model


def randomize_token2wav_(model: nn.Module, seed: int, post_gain: float = 1.0) -> None:
    """Token2wav's parameters by fan-in from one generator seeded by `seed` (make_tiny's draw), the
    vocoder's output convolution times `post_gain`. Names as the checkpoint's (`code2wav_*_model`)."""
    fan_in_randomize_(model, seed, unit=(CODEC_EMBED,))
    with torch.no_grad():
        model.code2wav_bigvgan_model.conv_post.weight.mul_(post_gain)


@torch.no_grad()
def level_vocoder_(vocoder: nn.Module, seed: int, rms: float = PCM_RMS, frames: int = 16) -> None:
    """Scale `vocoder.conv_post` so the PCM of a probe mel (a speaker's reference-mel scale) has `rms`."""
    w = vocoder.conv_post.weight
    gen = torch.Generator(device=w.device).manual_seed(int(seed) + 2)
    mel = torch.randn(1, vocoder.cfg.mel_dim, frames, generator=gen, device=w.device).to(w.dtype) - 4.0
    w.mul_(1e-6 / w.abs().max().clamp_min(1e-30))  # far from the +-1 clamp: the PCM is linear in w
    level = vocoder(mel).float().pow(2).mean().sqrt()
    if not torch.isfinite(level) or level <= 0:
        raise CheckpointError(f"random vocoder gives PCM of level {float(level)} on a probe mel")
    w.mul_(rms / level)


def random_token2wav(cfg, speakers: dict[str, dict[str, Any]], device="cpu", dtype=torch.float32, seed: int = 0):
    """`Token2Wav` of `cfg` (a Token2WavConfig) with the speakers of `spk_dict.pt`."""
    from omni.models.qwen2_5_omni.modules.alias_free import DownSample, UpSample, kaiser_sinc
    from omni.models.qwen2_5_omni.modules.token2wav import Token2Wav

    with randomized(lambda: Token2Wav(cfg, speakers), device, dtype, seed,
                    draw=lambda m: randomize_token2wav_(m, seed)) as model:
        dit = model.code2wav_dit_model
        dit.inv_freq = rope_inv_freq(cfg.dit.head_dim, cfg.dit.rope_theta).to(device)
        for mod in model.code2wav_bigvgan_model.modules():
            if isinstance(mod, (UpSample, DownSample)):
                ratio, taps = mod.ratio, mod.filter.shape[-1]
                mod.filter = kaiser_sinc(0.5 / ratio, 0.6 / ratio, taps).to(device, mod.filter.dtype)
        level_vocoder_(model.code2wav_bigvgan_model, seed)
    return model


_PARTS = ("thinker", "audio_encoder", "vision_encoder", "talker", "token2wav")


def random_part(part: str, args: Any, device) -> nn.Module | None:
    """The stage's part with random weights when its args say `load_format="random"`, else None.

    Reads the config (and for the talker and token2wav, the speakers of `spk_dict.pt`) from the
    args' model dir; `dtype` defaults to float32 (as the family's checkpoint loads do); `seed`
    (default 0) picks the weights, each part its own stream of them."""
    where = random_dir(part, args)
    if where is None:
        return None
    from omni.models.qwen2_5_omni.config import load_omni_config
    from omni.models.qwen2_5_omni.modules.token2wav import load_speakers

    cfg = load_omni_config(where)
    if part in ("talker", "token2wav") and (cfg.talker is None or cfg.token2wav is None):
        raise CheckpointError(f"{where} has no audio output, so no {part}")
    dtype = getattr(torch, arg(args, "dtype") or "float32")
    seed = int(arg(args, "seed") or 0) + _PARTS.index(part)
    if part == "thinker":
        return random_thinker(cfg.thinker, device, dtype, seed)
    if part == "audio_encoder":
        return random_audio_encoder(cfg.thinker.audio, device, dtype, seed)
    if part == "vision_encoder":
        return random_vision_encoder(cfg.thinker.vision, device, dtype, seed)
    speakers = load_speakers(where)
    if part == "talker":
        return random_talker(cfg, {n: int(v["bos_token"]) for n, v in speakers.items()}, device, dtype, seed)
    return random_token2wav(cfg.token2wav, speakers, device, dtype, seed)
