"""Rotary position embeddings (rotate-half convention), one frequency formula for every model.

`rope_inv_freq` gives the inverse frequencies (float32), `rope_angles` the angle of each
position and frequency, `cos_sin` the [..., D] tables (the angles repeated for both halves).
`mrope_cos_sin` is the interleaved M-RoPE of Qwen3-Omni's thinker and of every multi-codebook
talker: per-axis angles mixed between the last two steps.
"""

from __future__ import annotations

import torch


def rope_inv_freq(dim: int, theta: float, device=None) -> torch.Tensor:
    """1 / theta^(2i / dim) for i < dim / 2, float32."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))


def rope_angles(inv_freq: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[*positions.shape, D/2] float32: position times inverse frequency."""
    return positions[..., None].float() * inv_freq.to(positions.device, torch.float)


def cos_sin(angles: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [..., D] of angles [..., D/2], in `dtype`."""
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain 1-D RoPE cos/sin, [*positions.shape, head_dim]."""
    return cos_sin(rope_angles(inv_freq, positions), dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`x` [..., T, heads, D]; cos/sin [..., T, D], broadcast over the head axis."""
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return x * cos + rotate_half(x) * sin


DEFAULT_MROPE_SECTION = (24, 20, 20)  # what transformers silently uses when the config has none


def mrope_cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor, section: tuple[int, ...], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """`positions` [3, T] (or [T]: the same on every axis) -> cos, sin [T, head_dim].

    The frequencies are interleaved by axis: frequency pair j uses the height position when
    j % 3 == 1 and j < 3 * section[1], the width position when j % 3 == 2 and j < 3 * section[2],
    the temporal one otherwise (transformers' `recomposition_frequencies`)."""
    if positions.dim() == 1:
        positions = positions.expand(3, -1)
    freqs = rope_angles(inv_freq, positions)  # [3, T, D/2]
    mixed = freqs[0].clone()
    for axis in (1, 2):
        idx = slice(axis, section[axis] * 3, 3)
        mixed[..., idx] = freqs[axis][..., idx]
    return cos_sin(mixed, dtype)
