"""Random speech-tokenizer weights that keep signals in range, drawn where a tokenizer folder has
a config but no weights (a full-size benchmark preset) and by the tiny-checkpoint writer: the
loaders use it at run time, so it lives beside them, not in checkpoint/."""

from __future__ import annotations

import math

import torch
from torch import nn


@torch.no_grad()
def _init_(module: nn.Module, seed: int) -> None:
    """Random weights that keep signals in range through every layer: fan-in scaled matrices,
    norms near 1, residual scales and Snake parameters of order 0.1, codebooks of unit scale."""
    gen = torch.Generator().manual_seed(int(seed))

    def draw(shape, std, mean=0.0):
        return torch.randn(shape, generator=gen) * std + mean

    for name, t in sorted(list(module.named_parameters()) + list(module.named_buffers())):
        leaf = name.rsplit(".", 1)[-1]
        if not t.is_floating_point() or leaf == "inv_freq":
            continue
        if leaf in ("embedding_sum", "embed_sum"):
            value = draw(t.shape, 1.0)
        elif leaf == "cluster_usage":
            value = torch.rand(t.shape, generator=gen) * 1.5 + 0.5
        elif leaf == "initialized":
            value = torch.ones(t.shape)
        elif leaf in ("scale", "gamma"):
            value = torch.rand(t.shape, generator=gen) * 0.2 + 0.05
        elif leaf in ("alpha", "beta"):
            value = draw(t.shape, 0.2)
        elif leaf == "bias":
            value = draw(t.shape, 0.02)
        elif t.dim() == 1:  # norm weights
            value = draw(t.shape, 0.05, 1.0)
        else:
            fan_in = t[0].numel()
            value = draw(t.shape, 1.0 / math.sqrt(fan_in))
        t.copy_(value.to(t.dtype))


@torch.no_grad()
def init_decoder_(model: nn.Module, seed: int = 0, target_std: float = 0.3) -> None:
    """`_init_`, then the output conv scaled so random codes give speech-like levels (std
    `target_std`): PCM mostly inside the [-1, 1] clamp, so comparisons see the waveform."""
    _init_(model, seed)
    out = model.decoder[-1].conv
    seen: list[float] = []
    hook = out.register_forward_hook(lambda _m, _i, o: seen.append(float(o.float().std())))
    gen = torch.Generator().manual_seed(int(seed))
    codes = torch.randint(0, model.cfg.codebook_size, (1, model.cfg.num_quantizers, 8), generator=gen)
    try:
        model(codes.to(model.device))
    finally:
        hook.remove()
    gain = target_std / max(seen[0], 1e-6)
    out.weight.mul_(gain)
    out.bias.mul_(gain)


def init_encoder_(model: nn.Module, seed: int = 0) -> None:
    _init_(model, seed + 1)
