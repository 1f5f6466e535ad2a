"""The DiT's blocks: sinusoidal time embedding, AdaLayerNorm-Zero modulation, block-masked attention
with RoPE on the first head only (as the checkpoint was trained), and the GELU MLP. Module names
follow the reference checkpoint (`attn_norm.linear`, `attn.to_q`, `ff.ff.0`, ...)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omni.layers.attention import sdpa
from omni.layers.fused_linear import fuse_linears, still_fused
from omni.layers.rotary import apply_rope
from omni.models.qwen2_5_omni.modules import dit_fused

EPS = 1e-6


def sinusoid(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    """[N] times in [0, 1] -> [N, dim] (sin half, cos half)."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
    angles = scale * t.unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat((angles.sin(), angles.cos()), dim=-1).type_as(t)


class TimestepEmbedding(nn.Module):
    def __init__(self, dim: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.time_mlp = nn.ModuleList([nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim)])

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        h = sinusoid(t, self.freq_dim).to(self.time_mlp[0].weight.dtype)
        for layer in self.time_mlp:
            h = layer(h)
        return h


class AdaNorm(nn.Module):
    """LayerNorm (no affine) modulated by the time embedding; `chunks` parameter sets per row."""

    def __init__(self, dim: int, chunks: int):
        super().__init__()
        self.chunks = chunks
        self.linear = nn.Linear(dim, dim * chunks)

    def params_of(self, act: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The parameter sets from silu(emb) (computed once for every block of a forward)."""
        return torch.chunk(self.linear(act), self.chunks, dim=1)


def modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    if dit_fused.enabled(x):
        return dit_fused.modulate(x, scale, shift, EPS)
    return F.layer_norm(x, x.shape[-1:], eps=EPS) * (1 + scale[:, None]) + shift[:, None]


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (x0, x2, ..., x1, x3, ...): the checkpoint's RoPE pairs are interleaved."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


class BlockWindows:
    """Attention of each frame over the blocks [b - back, b + ahead] around its own block b, as SDPA over
    windows of keys: [N * B, heads, block, (back + 1 + ahead) * block] scores instead of [N, heads, T, T]
    (19 of the 22 published layers see their own block alone: 11x fewer scores at 11 blocks). Keys that
    are padding (past a row's length, or blocks before the first / after the last) are masked, but a
    frame always sees itself, so no softmax row is empty. Built once a forward per (back, ahead)."""

    def __init__(self, frames: int, block: int, back: int, ahead: int, real: torch.Tensor | None,
                 rows: int, dtype: torch.dtype, device) -> None:
        self.frames, self.block, self.back, self.ahead = frames, block, back, ahead
        self.blocks = -(-frames // block)
        span, padded = back + 1 + ahead, self.blocks * block
        blocks = torch.arange(self.blocks, device=device)
        key_block = blocks[:, None] + torch.arange(span, device=device)[None] - back  # [B, span]
        key_frame = key_block[..., None] * block + torch.arange(block, device=device)  # [B, span, block]
        inside = ((key_block >= 0) & (key_block < self.blocks))[..., None] & (key_frame < frames)
        keep = inside.reshape(1, self.blocks, 1, span * block)
        if real is not None:  # [rows, T]: the row's real frames
            real = F.pad(real, (0, padded - frames), value=False)
            keep = keep & real[:, key_frame.clamp(0, padded - 1).reshape(-1)].view(rows, self.blocks, 1, -1)
        own = torch.arange(block, device=device)
        itself = torch.arange(span * block, device=device)[None] == (back * block + own)[:, None]  # no host copy: graph-safe
        keep = keep | itself  # [rows or 1, B, block, span * block]
        self.mask = torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(~keep, float("-inf"))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v [N, T, heads, head_dim] -> [N, T, heads, head_dim]."""
        n, t, h, d = q.shape
        b, blk = self.blocks, self.block
        tail = b * blk - t
        q = _pad_frames(q, 0, tail).reshape(n * b, blk, h, d).transpose(1, 2)  # a view of q when not padded
        k, v = (self._windows(_pad_frames(x, self.back * blk, tail + self.ahead * blk)) for x in (k, v))
        mask = self.mask.expand(n, -1, -1, -1).reshape(n * b, 1, blk, -1)
        out = sdpa(q, k, v, attn_mask=mask)  # [N * B, heads, block, head_dim]
        return out.transpose(1, 2).reshape(n, b * blk, h, d)[:, :t]

    def _windows(self, x: torch.Tensor) -> torch.Tensor:
        """x padded by `back` blocks before and `ahead` after -> [N * B, heads, span * block, head_dim]."""
        n, _, h, d = x.shape
        b, blk = self.blocks, self.block
        x = x.reshape(n, -1, blk, h, d)
        x = x[:, :b] if self.back + self.ahead == 0 else torch.cat(
            [x[:, i:i + b] for i in range(self.back + 1 + self.ahead)], dim=2)
        return x.reshape(n * b, -1, h, d).transpose(1, 2)


def _pad_frames(x: torch.Tensor, before: int, after: int) -> torch.Tensor:
    """x [N, T, heads, head_dim] with zero frames before and after (x itself, uncopied, when none)."""
    return F.pad(x, (0, 0, 0, 0, before, after)) if before or after else x


class DiTAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        inner = heads * head_dim
        self.to_q = nn.Linear(hidden, inner)
        self.to_k = nn.Linear(hidden, inner)
        self.to_v = nn.Linear(hidden, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, hidden)])
        self.to_qkv: nn.Linear | None = None  # q/k/v as one GEMM on CUDA (`fuse_projections`)

    def fuse_projections(self) -> bool:
        if not still_fused(self.to_qkv, self.to_q, self.to_k, self.to_v):
            self.to_qkv = fuse_linears(self.to_q, self.to_k, self.to_v)
        return self.to_qkv is not None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, windows: BlockWindows) -> torch.Tensor:
        """x [N, T, hidden]; cos/sin [T, head_dim]; `windows`: which frames each frame attends to."""
        n, t, _ = x.shape
        if self.to_qkv is not None:
            q, k, v = self.to_qkv(x).view(n, t, 3, self.heads, self.head_dim).unbind(2)
        else:
            q, k, v = (p(x).view(n, t, self.heads, self.head_dim) for p in (self.to_q, self.to_k, self.to_v))
        if dit_fused.enabled(q) and cos.dtype == q.dtype:
            dit_fused.rope_first_head_(q, k, cos, sin)
        else:
            q = torch.cat((apply_rope(deinterleave(q[:, :, :1]), cos, sin), q[:, :, 1:]), dim=2)
            k = torch.cat((apply_rope(deinterleave(k[:, :, :1]), cos, sin), k[:, :, 1:]), dim=2)
        return self.to_out[0](windows(q, k, v).reshape(n, t, -1))


class MLP(nn.Module):
    def __init__(self, dim: int, mult: int):
        super().__init__()
        inner = int(dim * mult)  # index 2 was a Dropout: Identity keeps the checkpoint's indices
        self.ff = nn.ModuleList([nn.Linear(dim, inner), nn.GELU(approximate="tanh"), nn.Identity(), nn.Linear(inner, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.ff:
            x = layer(x)
        return x


class DiTBlock(nn.Module):
    """Attention over the blocks within [-back, +ahead] of a frame's own, then the MLP, both gated."""

    def __init__(self, cfg, back: int, ahead: int):
        super().__init__()
        self.back, self.ahead = back, ahead
        self.attn_norm = AdaNorm(cfg.hidden_size, 6)
        self.attn = DiTAttention(cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim)
        self.ff = MLP(cfg.hidden_size, cfg.ff_mult)

    def forward(self, x, params, cos, sin, windows: BlockWindows):
        """`params`: the six modulation sets (`attn_norm.params_of`); `windows`: this block's attention
        span (`DiT.velocity` builds both). Each gated residual is one fused multiply-add."""
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = params
        x = torch.addcmul(x, gate_a.unsqueeze(1), self.attn(modulate(x, scale_a, shift_a), cos, sin, windows))
        return torch.addcmul(x, gate_m.unsqueeze(1), self.ff(modulate(x, scale_m, shift_m)))
