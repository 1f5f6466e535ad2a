"""Rotary position embeddings (rotate-half convention), one frequency formula for every model.

`rope_inv_freq` gives the inverse frequencies (float32), `rope_angles` the angle of each
position and frequency, `cos_sin` the [..., D] tables (the angles repeated for both halves).
`mrope_cos_sin` is the M-RoPE of the Qwen omni thinkers and talkers: interleaved (Qwen3-Omni's thinker
and every multi-codebook talker: per-axis angles mixed between the last two steps) or in contiguous
sections (Qwen2-VL's layout, which Qwen2.5-Omni's thinker and talker use).
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
    inv_freq: torch.Tensor, positions: torch.Tensor, section: tuple[int, ...], dtype: torch.dtype,
    interleaved: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`positions` [3, T] (or [T]: the same on every axis) -> cos, sin [T, head_dim].

    Interleaved (Qwen3): frequency pair j uses the height position when j % 3 == 1 and
    j < 3 * section[1], the width position when j % 3 == 2 and j < 3 * section[2], the temporal one
    otherwise (transformers' Qwen3-Omni `recomposition_frequencies`). Not interleaved (Qwen2-VL,
    Qwen2.5-Omni): the first section[0] pairs take the temporal position, the next section[1] the
    height, the next section[2] the width."""
    if positions.dim() == 1:
        positions = positions.expand(3, -1)
    freqs = rope_angles(inv_freq, positions)  # [3, T, D/2]
    if not interleaved:
        parts = freqs.split(list(section), dim=-1)
        return cos_sin(torch.cat([part[i % 3] for i, part in enumerate(parts)], dim=-1), dtype)
    mixed = freqs[0].clone()
    for axis in (1, 2):
        idx = slice(axis, section[axis] * 3, 3)
        mixed[..., idx] = freqs[axis][..., idx]
    return cos_sin(mixed, dtype)
