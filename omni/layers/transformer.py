"""Whisper's pre-LayerNorm transformer block, its sinusoidal positions and a windowed bidirectional
attention (the Qwen omni audio towers use them).

x + attn(self_attn_layer_norm(x)), then x + fc2(gelu(fc1(final_layer_norm(x)))). The attention
module and how it is called (a mask, a cache, cross-attention in between) are the caller's.
"""

from __future__ import annotations

import math
from hashlib import blake2b

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from omni.layers.attention import sdpa


class PreNormBlock(nn.Module):
    def __init__(self, attn: nn.Module, dim: int, ffn_dim: int) -> None:
        super().__init__()
        self.self_attn = attn
        self.self_attn_layer_norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, dim)
        self.final_layer_norm = nn.LayerNorm(dim)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The feed-forward branch (its residual add is the caller's)."""
        return self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """Whisper's fixed positions [length, channels]: sines then cosines."""
    step = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-step * torch.arange(channels // 2).float())
    t = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class AudioAttention(nn.Module):
    """Bidirectional attention over padded windows (`k_bias` False: Whisper's key projection)."""

    def __init__(self, dim: int, heads: int, k_bias: bool = True):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj = nn.Linear(dim, dim), nn.Linear(dim, dim, bias=k_bias)
        self.v_proj, self.out_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [windows, len, dim]; mask [windows, len] marks real positions."""
        w, n, d = x.shape
        split = lambda t: t.view(w, n, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        out = sdpa(q, k, v, attn_mask=mask[:, None, None, :])
        return self.out_proj(out.transpose(1, 2).reshape(w, n, d))


class AudioEncoderLayer(PreNormBlock):
    """A Whisper-style audio tower's layer: windowed self-attention (`mask` marks each window's real
    rows), then the feed-forward branch, each with its residual."""

    def __init__(self, dim: int, heads: int, ffn_dim: int, k_bias: bool = True):
        super().__init__(AudioAttention(dim, heads, k_bias), dim, ffn_dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), mask)
        return x + self.mlp(x)


def input_digest(features, pad_len: int, rows: int) -> np.ndarray:
    """[rows, 16] uint8: one audio's features and pad_len hashed, repeated for each of its rows (the
    audio towers' `audio_keys`)."""
    h = blake2b(np.ascontiguousarray(features, dtype=np.float32).tobytes(), digest_size=16)
    h.update(f"{np.shape(features)}:{pad_len}".encode())
    return np.tile(np.frombuffer(h.digest(), dtype=np.uint8), (rows, 1))

