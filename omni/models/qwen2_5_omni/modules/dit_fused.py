"""Fused kernels for the DiT's per-block small ops (on CUDA, with `fused_ops` on): fewer launches a forward.

Eagerly a DiT block is ~45 kernels, most of them elementwise: the modulated LayerNorm
(`layer_norm(x) * (1 + scale) + shift`, 4 kernels, twice a block) and the RoPE of the first head of
q and k (de-interleave, rotate-half, the products and the sums, the concatenations back: ~14). Even
replayed from a CUDA graph the forward was ~1,000 kernels of ~3 us (RESULTS 2026-12-04). Here:
- `modulate`: one program per frame: LayerNorm (no affine, float32 inside), times (1 + scale) plus
  shift of its row, each step rounded to the dtype as the eager ops round it;
- `rope_first_head_`: in place, the first head of q and of k (one launch for both): its interleaved
  pairs read as (evens, odds) (the checkpoint's layout, `dit_layers.deinterleave`) and rotated with
  rotate-half RoPE, written in the de-interleaved order the eager path's concatenation gives.
No host syncs (graph-safe). On a CPU they run only in triton's interpreter (tests).
"""

from __future__ import annotations

import torch

from omni.layers import fused_ops

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None


def enabled(x: torch.Tensor) -> bool:
    return fused_ops.enabled(x) and x.dtype in fused_ops.FUSED_DTYPES


if triton is not None:

    @triton.jit
    def _modulate_kernel(x_ptr, scale_ptr, shift_ptr, out_ptr, frames, stride_x, stride_p, stride_o, eps,
                         N: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        item = row // frames
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        dt = out_ptr.dtype.element_ty
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / N
        centred = tl.where(mask, x - mean, 0.0)
        normed = (centred * tl.rsqrt(tl.sum(centred * centred, axis=0) / N + eps)).to(dt).to(tl.float32)
        scale = tl.load(scale_ptr + item * stride_p + cols, mask=mask, other=0.0).to(tl.float32)
        shift = tl.load(shift_ptr + item * stride_p + cols, mask=mask, other=0.0).to(tl.float32)
        y = (normed * (1.0 + scale).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        tl.store(out_ptr + row * stride_o + cols, (y + shift).to(dt), mask=mask)

    @triton.jit
    def _rope_first_head_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, frames, stride_q, stride_k, stride_c,
                                HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        src = tl.where(tl.program_id(1) == 0, q_ptr + row * stride_q, k_ptr + row * stride_k)
        t = row % frames
        offs = tl.arange(0, BLOCK_HALF)
        mask = offs < HALF
        dt = src.dtype.element_ty
        x1 = tl.load(src + 2 * offs, mask=mask, other=0.0).to(tl.float32)  # the evens
        x2 = tl.load(src + 2 * offs + 1, mask=mask, other=0.0).to(tl.float32)  # the odds
        c1 = tl.load(cos_ptr + t * stride_c + offs, mask=mask, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + t * stride_c + HALF + offs, mask=mask, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + t * stride_c + offs, mask=mask, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + t * stride_c + HALF + offs, mask=mask, other=0.0).to(tl.float32)
        o1 = (x1 * c1).to(dt).to(tl.float32) + (-x2 * s1).to(dt).to(tl.float32)
        o2 = (x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)
        tl.debug_barrier()  # every load of the row before the first store over it
        tl.store(src + offs, o1.to(dt), mask=mask)
        tl.store(src + HALF + offs, o2.to(dt), mask=mask)


def modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float) -> torch.Tensor:
    """x [B, T, N], scale / shift [B, N] -> layer_norm(x) * (1 + scale) + shift (as `dit_layers.modulate`)."""
    b, t, n = x.shape
    if scale.shape != (b, n) or shift.shape != (b, n) or scale.stride() != shift.stride() or scale.stride(1) != 1:
        raise fused_ops.FusedOpsInputError(f"modulate: scale {tuple(scale.shape)} / shift for x {tuple(x.shape)}")
    x = x if x.stride(2) == 1 and x.stride(0) == t * x.stride(1) else x.contiguous()
    out = torch.empty(b, t, n, dtype=x.dtype, device=x.device)
    if b * t:
        block = triton.next_power_of_2(n)
        _modulate_kernel[(b * t,)](x, scale, shift, out, t, x.stride(1), scale.stride(0), n, eps, N=n, BLOCK=block,
                                   num_warps=4 if block <= 2048 else 8)
    return out


def rope_first_head_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """q, k [B, T, heads, D] (views may be strided over the last two axes' rows), cos / sin [T, D]:
    head 0 of each, in place, as `cat(apply_rope(deinterleave(x[:, :, :1]), cos, sin), x[:, :, 1:])`."""
    b, t, _, d = q.shape
    if k.shape[:2] != (b, t) or k.shape[3] != d or cos.shape != (t, d) or sin.stride() != cos.stride() or d % 2:
        raise fused_ops.FusedOpsInputError(f"rope_first_head_: q {tuple(q.shape)}, k {tuple(k.shape)}, cos "
                                           f"{tuple(cos.shape)}")
    for x in (q, k):
        if x.stride(3) != 1 or x.stride(0) != t * x.stride(1):
            raise fused_ops.FusedOpsInputError("rope_first_head_: rows of q / k must be evenly strided")
    if b * t:
        half = d // 2
        _rope_first_head_kernel[(b * t, 2)](q, k, cos, sin, t, q.stride(1), k.stride(1), cos.stride(0), HALF=half,
                                            BLOCK_HALF=triton.next_power_of_2(half), num_warps=1)
