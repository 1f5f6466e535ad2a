"""The codec decoder's pre-transformer: causal sliding-window attention with a rolling KV cache.

Each stream keeps the keys/values of its last `window - 1` frames, padded to that fixed size so
streams at different positions batch together; a per-row mask hides the padding.
"""

from __future__ import annotations

import torch
from torch import nn

from omni.layers.mlp import GatedMLP
from omni.layers.norms import LayerScale, RMSNorm
from omni.layers.rotary import apply_rope, rope_cos_sin, rope_inv_freq
from omni.layers.attention import sdpa
from omni.layers.codec.streaming_layers import StreamBatch
from omni.layers.configs import WaveDecoderConfig


class SlidingAttention(nn.Module):
    def __init__(self, cfg: WaveDecoderConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.window = cfg.sliding_window
        bias = getattr(cfg, "attention_bias", False)  # Qwen3-TTS's decoder config may set it
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.key = ""

    @property
    def cache_len(self) -> int:
        return max(self.window - 1, 0)

    def init_state(self, dtype, device) -> dict[str, torch.Tensor]:
        shape = (1, self.kv_heads, self.cache_len, self.head_dim)
        return {self.key + ".k": torch.zeros(shape, dtype=dtype, device=device),
                self.key + ".v": torch.zeros(shape, dtype=dtype, device=device)}

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, st: StreamBatch) -> torch.Tensor:
        b, t, _ = x.shape
        q = apply_rope(self.q_proj(x).view(b, t, self.heads, self.head_dim), cos, sin).transpose(1, 2)
        k = apply_rope(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim), cos, sin).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        keys = torch.cat([st.tensors[self.key + ".k"], k], dim=2)
        values = torch.cat([st.tensors[self.key + ".v"], v], dim=2)
        c = self.cache_len
        st.tensors[self.key + ".k"] = keys[:, :, keys.shape[2] - c:]
        st.tensors[self.key + ".v"] = values[:, :, values.shape[2] - c:]
        rep = self.heads // self.kv_heads
        keys, values = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)
        mask = self._mask(st.pos, t, x.device)
        out = sdpa(q, keys, values, attn_mask=mask, scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def _mask(self, pos: torch.Tensor, t: int, device) -> torch.Tensor:
        """[B, 1, t, cache + t] booleans: key j visible to query i (causal, within the window,
        and not cache padding of a stream younger than the cache)."""
        c = self.cache_len
        # key j sits at relative offset (j - c) from the first new frame; query i at offset i
        offset = torch.arange(c + t, device=device) - c
        query = torch.arange(t, device=device)[:, None]
        visible = (offset[None, :] <= query) & (query - offset[None, :] < self.window)
        filled = offset[None, :] >= -pos.to(device)[:, None]  # [B, c + t]
        return (visible[None] & filled[:, None, :])[:, None]


class TransformerLayer(nn.Module):
    def __init__(self, cfg: WaveDecoderConfig):
        super().__init__()
        self.self_attn = SlidingAttention(cfg)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x, cos, sin, st: StreamBatch) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, st))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(nn.Module):
    """With `io_dim` (Qwen3-TTS), linear maps io_dim -> hidden_size before the layers and back after."""

    def __init__(self, cfg: WaveDecoderConfig, io_dim: int | None = None):
        super().__init__()
        self.layers = nn.ModuleList([TransformerLayer(cfg) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(io_dim, cfg.hidden_size) if io_dim else None
        self.output_proj = nn.Linear(cfg.hidden_size, io_dim) if io_dim else None
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)

    def forward(self, x: torch.Tensor, st: StreamBatch) -> torch.Tensor:
        positions = st.pos.to(x.device)[:, None] + torch.arange(x.shape[1], device=x.device)[None]
        cos, sin = rope_cos_sin(self.inv_freq, positions, x.dtype)
        if self.input_proj is not None:
            x = self.input_proj(x)
        for layer in self.layers:
            x = layer(x, cos, sin, st)
        x = self.norm(x)
        return x if self.output_proj is None else self.output_proj(x)
