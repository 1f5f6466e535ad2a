"""Fused Triton kernels for the thinker's small per-layer ops: fewer launches per decode step.

A decode step at batch 1 is launch-bound: the float32 RMSNorm is ~6 kernels, rotate-half RoPE
~8 per tensor, the router ~6. Three kernels replace them, each one program per row:
- `rms_norm`: (optionally x + residual ->) RMSNorm, float32 inside;
- `qk_norm_rope`: per-head q/k RMSNorm then rotate-half RoPE for q and k in one launch;
- `route_topk`: router logits -> float32 softmax -> top-k -> renormalise -> weights + ids.
The maths is transformers' order of operations, each elementwise result rounded to the tensor
dtype where torch's eager code rounds it (so bf16 results match the eager path up to the
float32 reduction order). Top-k picks the lowest expert id among exactly equal probabilities;
torch.topk's tie order is unspecified, so ids may differ from it on exact ties only.
No host syncs (safe inside CUDA graphs). A stage's `fused_ops=False` arg turns them off for its
process (`use_fused_ops`, called once at set-up; `enabled` reads only that).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None

FUSED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class FusedOpsInputError(ValueError):
    """Shapes, dtypes or layouts the fused kernels do not take."""


_ON = True  # this process's switch: set once by the stage (`use_fused_ops`), read on every forward


def use_fused_ops(on: bool) -> None:
    """Turn the fused kernels on or off for this process (a stage's `fused_ops` arg, at set-up)."""
    global _ON
    _ON = bool(on)


def enabled(x: torch.Tensor) -> bool:
    """Use the fused kernels for `x`: on CUDA, with triton, unless turned off (`use_fused_ops`)."""
    return _ON and x.is_cuda and triton is not None


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise FusedOpsInputError(msg)


def _rows(x: torch.Tensor, name: str) -> torch.Tensor:
    """`x` as [rows, last] with a unit last stride (a view when possible)."""
    _check(x.dtype in FUSED_DTYPES, f"{name}: dtype {x.dtype} not in {FUSED_DTYPES}")
    x = x.reshape(-1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


if triton is not None:

    @triton.jit
    def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, stride_x, stride_r, stride_o, stride_ro, eps,
                         N: tl.constexpr, BLOCK: tl.constexpr, HAS_RES: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
        if HAS_RES:  # the residual sum is rounded to the dtype, as torch's `x + residual`
            r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
            tl.store(res_out_ptr + row * stride_ro + cols, x, mask=mask)
        h = x.to(tl.float32)
        inv = tl.rsqrt(tl.sum(h * h, axis=0) / N + eps)
        dt = out_ptr.dtype.element_ty
        normed = (h * inv).to(dt).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_o + cols, (w * normed).to(dt), mask=mask)

    @triton.jit
    def head_norm_rope_values(src, w_ptr, c1, c2, s1, s2, offs, mask, eps, HALF: tl.constexpr):
        """One head: RMSNorm over its 2*HALF values, times weight, then rotate-half RoPE; the two
        halves in float32 before their last rounding to the source dtype (also the code predictor's)."""
        dt = src.dtype.element_ty
        x1 = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(src + HALF + offs, mask=mask, other=0.0).to(tl.float32)
        inv = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / (2 * HALF) + eps)
        w1 = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + offs, mask=mask, other=0.0).to(tl.float32)
        y1 = (w1 * (x1 * inv).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        y2 = (w2 * (x2 * inv).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        # x * cos + cat(-x2, x1) * sin, each product rounded to the dtype before the sum
        o1 = (y1 * c1).to(dt).to(tl.float32) + (-y2 * s1).to(dt).to(tl.float32)
        o2 = (y2 * c2).to(dt).to(tl.float32) + (y1 * s2).to(dt).to(tl.float32)
        return o1, o2

    @triton.jit
    def _head_norm_rope(src, dst, w_ptr, c1, c2, s1, s2, offs, mask, eps, HALF: tl.constexpr, NORM: tl.constexpr):
        if NORM:
            o1, o2 = head_norm_rope_values(src, w_ptr, c1, c2, s1, s2, offs, mask, eps, HALF)
        else:  # rope alone, rounded as `rotary.apply_rope` rounds it (each product, then the sum)
            dt = src.dtype.element_ty
            y1 = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
            y2 = tl.load(src + HALF + offs, mask=mask, other=0.0).to(tl.float32)
            o1 = (y1 * c1).to(dt).to(tl.float32) + (-y2 * s1).to(dt).to(tl.float32)
            o2 = (y2 * c2).to(dt).to(tl.float32) + (y1 * s2).to(dt).to(tl.float32)
        dt = dst.dtype.element_ty
        tl.store(dst + offs, o1.to(dt), mask=mask)
        tl.store(dst + HALF + offs, o2.to(dt), mask=mask)

    @triton.jit
    def _qk_norm_rope_kernel(q_ptr, k_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
                             stride_qt, stride_qh, stride_kt, stride_kh, stride_ct, stride_st,
                             stride_qot, stride_kot, eps,
                             Q_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, NORM: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        offs = tl.arange(0, BLOCK_HALF)
        mask = offs < HALF
        c1 = tl.load(cos_ptr + t * stride_ct + offs, mask=mask, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + t * stride_ct + HALF + offs, mask=mask, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + t * stride_st + offs, mask=mask, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + t * stride_st + HALF + offs, mask=mask, other=0.0).to(tl.float32)
        if head < Q_HEADS:
            _head_norm_rope(q_ptr + t * stride_qt + head * stride_qh, qo_ptr + t * stride_qot + head * (2 * HALF),
                            qw_ptr, c1, c2, s1, s2, offs, mask, eps, HALF, NORM)
        else:
            kh = head - Q_HEADS
            _head_norm_rope(k_ptr + t * stride_kt + kh * stride_kh, ko_ptr + t * stride_kot + kh * (2 * HALF),
                            kw_ptr, c1, c2, s1, s2, offs, mask, eps, HALF, NORM)

    @triton.jit
    def _route_topk_kernel(logits_ptr, w_out_ptr, id_out_ptr, stride_l,
                           E: tl.constexpr, K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                           RENORM: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK_E)
        mask = offs < E
        logits = tl.load(logits_ptr + row * stride_l + offs, mask=mask, other=float("-inf")).to(tl.float32)
        e = tl.where(mask, tl.exp(logits - tl.max(logits, axis=0)), 0.0)
        probs = tl.where(mask, e / tl.sum(e, axis=0), -1.0)  # padding below any probability
        kofs = tl.arange(0, BLOCK_K)
        weights = tl.zeros([BLOCK_K], dtype=tl.float32)
        ids = tl.zeros([BLOCK_K], dtype=tl.int32)
        for j in tl.static_range(K):  # k rounds of argmax; lowest id wins a tie
            best = tl.max(probs, axis=0)
            idx = tl.min(tl.where(probs == best, offs, BLOCK_E), axis=0)
            weights = tl.where(kofs == j, best, weights)
            ids = tl.where(kofs == j, idx, ids)
            probs = tl.where(offs == idx, -2.0, probs)
        if RENORM:
            weights = weights / tl.sum(tl.where(kofs < K, weights, 0.0), axis=0)
        kmask = kofs < K
        tl.store(w_out_ptr + row * K + kofs, weights.to(w_out_ptr.dtype.element_ty), mask=kmask)
        tl.store(id_out_ptr + row * K + kofs, ids.to(tl.int64), mask=kmask)


def _warps(block: int) -> int:
    return 1 if block <= 256 else 4 if block <= 2048 else 8


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`weight * rmsnorm(x)` over the last dim; with `residual`: (norm(x + residual), x + residual).

    Needs weight.dtype == x.dtype (the output dtype, as torch's promotion would give).
    """
    _check(weight.dim() == 1 and weight.shape[0] == x.shape[-1], f"weight {tuple(weight.shape)} for x {tuple(x.shape)}")
    _check(weight.dtype == x.dtype, f"weight dtype {weight.dtype} != x dtype {x.dtype}")
    rows = _rows(x, "x")
    n = rows.shape[1]
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    res_rows, res_out = rows, out
    if residual is not None:
        _check(residual.shape == x.shape and residual.dtype == x.dtype, "residual must match x in shape and dtype")
        res_rows = _rows(residual, "residual")
        res_out = torch.empty_like(out)
    if rows.shape[0] == 0:
        return out.view(x.shape) if residual is None else (out.view(x.shape), res_out.view(x.shape))
    block = triton.next_power_of_2(n)
    _rms_norm_kernel[(rows.shape[0],)](
        rows, res_rows, weight.contiguous(), out, res_out, rows.stride(0), res_rows.stride(0), out.stride(0),
        res_out.stride(0), eps, N=n, BLOCK=block, HAS_RES=residual is not None, num_warps=_warps(block))
    if residual is None:
        return out.view(x.shape)
    return out.view(x.shape), res_out.view(x.shape)


def qk_norm_rope(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
    cos: torch.Tensor, sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k [T, Hk, D] -> rope(rmsnorm(q) * q_weight), rope(rmsnorm(k) * k_weight); without
    weights (None: Qwen2's attention has no q/k norms) rope(q), rope(k), as `rotary.apply_rope` gives them.

    cos/sin [T, D] (rotate-half layout, as `rope.mrope_cos_sin` gives); one launch for both.
    """
    _check(q.dim() == 3 and k.dim() == 3 and q.shape[0] == k.shape[0] and q.shape[2] == k.shape[2],
           f"q {tuple(q.shape)} and k {tuple(k.shape)} must be [T, heads, D] with the same T and D")
    t, q_heads, d = q.shape
    _check(d % 2 == 0, f"head_dim {d} must be even")
    _check(cos.shape == (t, d) and sin.shape == (t, d), f"cos/sin {tuple(cos.shape)} must be [{t}, {d}]")
    norm = q_weight is not None
    _check(norm == (k_weight is not None), "q_weight and k_weight: both or neither")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)) if norm else ():
        _check(w.shape == (d,) and w.dtype == q.dtype, f"{name} must be [{d}] in {q.dtype}")
    _check(k.dtype == q.dtype and cos.dtype == q.dtype and sin.dtype == q.dtype, "q, k, cos, sin: one dtype")
    _check(q.dtype in FUSED_DTYPES, f"dtype {q.dtype} not in {FUSED_DTYPES}")
    _check(q.stride(2) == 1 and k.stride(2) == 1 and cos.stride(1) == 1 and sin.stride(1) == 1,
           "the last dim of q, k, cos and sin must be contiguous")
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if t == 0:
        return q_out, k_out
    half = d // 2
    _qk_norm_rope_kernel[(t, q_heads + k.shape[1])](
        q, k, q_weight.contiguous() if norm else cos, k_weight.contiguous() if norm else cos, cos, sin, q_out, k_out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
        q_out.stride(0), k_out.stride(0), eps,
        Q_HEADS=q_heads, HALF=half, BLOCK_HALF=triton.next_power_of_2(half), NORM=norm, num_warps=1)
    return q_out, k_out


def route_topk(
    logits: torch.Tensor, top_k: int, renormalize: bool, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, k] in out_dtype, expert ids [T, k] int64), best first."""
    _check(logits.dim() == 2 and 0 < top_k <= logits.shape[1], f"logits {tuple(logits.shape)}, top_k {top_k}")
    rows = _rows(logits, "logits")
    t, e = rows.shape
    weights = torch.empty(t, top_k, dtype=out_dtype, device=logits.device)
    ids = torch.empty(t, top_k, dtype=torch.int64, device=logits.device)
    if t == 0:
        return weights, ids
    block_e = triton.next_power_of_2(e)
    _route_topk_kernel[(t,)](rows, weights, ids, rows.stride(0), E=e, K=top_k, BLOCK_E=block_e,
                             BLOCK_K=triton.next_power_of_2(top_k), RENORM=renormalize, num_warps=_warps(block_e))
    return weights, ids
