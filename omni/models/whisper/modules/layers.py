"""Whisper's torch modules, named like transformers' so a checkpoint's tensors load by name.

The encoder runs whole 30 s windows in one batched forward. The decoder layers here hold only
weights and the cross-attention helper; `decoder.WhisperDecoder` runs them on the AR engine.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni.layers.transformer import PreNormBlock
from omni.models.whisper.config import WhisperConfig
from omni.layers.attention import sdpa


class Attention(nn.Module):
    """q/k/v/out projections (k without bias, as in Whisper)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """[..., T, dim] -> [..., T, heads, head_dim]"""
        return x.unflatten(-1, (self.heads, self.head_dim))

    def keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys/values of [S, dim] memory, as [heads, S, head_dim] each."""
        k = self.split(self.k_proj(memory)).transpose(0, 1).contiguous()  # contiguous: SDPA's fast path
        return k, self.split(self.v_proj(memory)).transpose(0, 1).contiguous()

    def full(self, x: torch.Tensor) -> torch.Tensor:
        """Bidirectional self-attention over [B, T, dim]."""
        q, k, v = (self.split(p(x)).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        out = sdpa(q, k, v)
        return self.out_proj(out.transpose(1, 2).flatten(2))


class EncoderLayer(PreNormBlock):
    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__(Attention(cfg.d_model, cfg.encoder_heads), cfg.d_model, cfg.encoder_ffn_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn.full(self.self_attn_layer_norm(x))
        return x + self.mlp(x)


class WhisperEncoder(nn.Module):
    """[B, n_mels, 3000] log-mel -> [B, 1500, d_model]."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(cfg.num_mel_bins, cfg.d_model, 3, padding=1)
        self.conv2 = nn.Conv1d(cfg.d_model, cfg.d_model, 3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(cfg.max_source_positions, cfg.d_model)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.layer_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x)).transpose(1, 2)
        x = x + self.embed_positions.weight[: x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class DecoderLayer(PreNormBlock):
    """Self-attention, cross-attention (`encoder_attn`), then the feed-forward (`mlp`)."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__(Attention(cfg.d_model, cfg.decoder_heads), cfg.d_model, cfg.decoder_ffn_dim)
        self.encoder_attn = Attention(cfg.d_model, cfg.decoder_heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(cfg.d_model)


class TextDecoder(nn.Module):
    """The decoder's weights (transformers' `model.decoder.*`); `decoder.WhisperDecoder` runs them."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.embed_positions = nn.Embedding(cfg.max_target_positions, cfg.d_model)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        self.layer_norm = nn.LayerNorm(cfg.d_model)
