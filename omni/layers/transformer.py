"""Whisper's pre-LayerNorm transformer block (Qwen3-Omni's audio tower uses the same one).

x + attn(self_attn_layer_norm(x)), then x + fc2(gelu(fc1(final_layer_norm(x)))). The attention
module and how it is called (a mask, a cache, cross-attention in between) are the caller's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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
