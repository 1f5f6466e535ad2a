"""The attention front end of the Qwen decoders: q/k/v/o projections, per-head q/k RMSNorm (Qwen3;
Qwen2's decoders have none, and biases on q/k/v), then RoPE. The attention itself is the caller's (the paged cache, or SDPA over a small cache);
every SDPA call of omni goes through `sdpa` here.

On CUDA with triton, q/k norm + RoPE (RoPE alone for Qwen2) run as one fused kernel
(`fused_ops.qk_norm_rope`); otherwise `RMSNorm` then `rotary.apply_rope`, the same roundings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from omni.layers import fused_ops
from omni.layers.fused_linear import fuse_linears, still_fused
from omni.layers.norms import RMSNorm
from omni.layers.rotary import apply_rope

# cuDNN's SDPA builds an execution plan for every new shape on first use: 0.7-1.1 s on an H200 for a
# 96-row prefill (bench/tts_first_use.py), paid by each new prompt length a server meets. Flash and
# memory-efficient attention need no plan; math is the fallback for what neither takes.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """`F.scaled_dot_product_attention` (same arguments) without the cuDNN backend. On the CPU,
    which has no cuDNN, the call is torch's as it is (the backend switch costs ~20 us a call,
    which an eager CPU decode would pay in every layer)."""
    if q.device.type == "cpu":
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    if kwargs.get("enable_gqa") and kwargs.get("attn_mask") is not None and k.shape[-3] != q.shape[-3]:
        # Flash takes no mask and memory-efficient attention no GQA, so this call would fall to the
        # math backend: the keys repeated and both matmuls in float32 (~0.2 ms a layer for one
        # 2k-token decode row on an H200). Repeated here, in the inputs' dtype, efficient attention takes it.
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
        kwargs = {**kwargs, "enable_gqa": False}
    with sdpa_kernel(SDPA_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


class QKVProjection(nn.Module):
    """q/k/v/o projections plus the per-head q/k norms (the attention maths lives elsewhere).

    `bias`: on all four projections; `qkv_bias`: on q/k/v only (Qwen2's layout); `qk_norm` False:
    no per-head norms (Qwen2's decoders)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float, bias: bool = False,
                 qkv_bias: bool = False, qk_norm: bool = True) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias or qkv_bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias or qkv_bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias or qkv_bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.qkv_proj: nn.Linear | None = None  # q/k/v as one projection, once `fuse_projections` ran

    def fuse_projections(self) -> bool:
        """q/k/v as one GEMM (a launch, not three); the three projections' weights become views of it.
        Once per set of parts (a second engine on the same model keeps the first one's graphs valid)."""
        if not still_fused(self.qkv_proj, self.q_proj, self.k_proj, self.v_proj):
            self.qkv_proj = fuse_linears(self.q_proj, self.k_proj, self.v_proj)
        return self.qkv_proj is not None

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`x` [..., T, hidden] -> q [..., T, heads, hd], k and v [..., T, kv_heads, hd], RoPE applied.

        cos/sin are [..., T, hd]; they broadcast over the head axis.
        """
        lead = x.shape[:-1]
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(x).split([self.q_proj.out_features, self.k_proj.out_features,
                                              self.v_proj.out_features], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(*lead, self.heads, self.head_dim)
        k = k.view(*lead, self.kv_heads, self.head_dim)
        v = v.view(*lead, self.kv_heads, self.head_dim)
        if self._fused(x, cos, sin):  # [q/k norm +] rope: one launch for both
            rows, d = -1, self.head_dim
            c = cos.expand(*lead, d).reshape(rows, d)
            s = sin.expand(*lead, d).reshape(rows, d)
            norms = (None, None, 0.0) if self.q_norm is None else (self.q_norm.weight, self.k_norm.weight,
                                                                    self.q_norm.eps)
            q, k = fused_ops.qk_norm_rope(q.reshape(rows, self.heads, d), k.reshape(rows, self.kv_heads, d), *norms,
                                          c, s)
            return q.view(*lead, self.heads, d), k.view(*lead, self.kv_heads, d), v
        if self.q_norm is None:
            return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v
        return apply_rope(self.q_norm(q), cos, sin), apply_rope(self.k_norm(k), cos, sin), v

    def _fused(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
        norms = () if self.q_norm is None else (self.q_norm.weight.dtype, self.k_norm.weight.dtype)
        return fused_ops.enabled(x) and all(dt == x.dtype for dt in (*norms, cos.dtype, sin.dtype))
