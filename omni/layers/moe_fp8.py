"""The fused routed-expert MoE (`moe_triton`) with FP8 experts: e4m3 weights in 128x128 blocks
(gate and up stacked, each in whole blocks), activations quantized per row and 128-group on the fly.

Same layout and launches as `moe_triton` (its `layout`, `_block_rows` and `_sum_top_k` are reused;
no host syncs, static shapes for CUDA graphs); only the K loops differ: each 128-wide K step
quantizes the block's x (or h) rows in registers (`fp8_gemm.quant_group`), runs an e4m3 dot and
adds it times scale_a (per row) * scale_w (per expert, 128 output columns, K block) in float32.
h between the two GEMMs stays in x's dtype, as in the bf16 kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omni.layers import moe_triton
from omni.layers.fp8 import E4M3
from omni.layers.fp8_gemm import GROUP

triton = moe_triton.triton
if triton is not None:
    import triton.language as tl

    from omni.layers.fp8_gemm import quant_group, scaled_dot
    from omni.layers.moe_triton import _block_rows, _sum_top_k


@dataclass(frozen=True)
class Fp8MoeConfig:
    block_m: int
    block_n: int
    down_block_n: int
    num_warps: int = 4
    num_stages: int = 4


CONFIGS: tuple[tuple[int, Fp8MoeConfig], ...] = (
    (64, Fp8MoeConfig(16, 32, 64)),
    (1024, Fp8MoeConfig(16, 64, 64, num_stages=3)),
    (8192, Fp8MoeConfig(32, 64, 64, num_stages=3)),
    (1 << 62, Fp8MoeConfig(64, 128, 128, num_warps=8, num_stages=3)),
)


def pick_config(num_pairs: int) -> Fp8MoeConfig:
    return next(cfg for limit, cfg in CONFIGS if num_pairs <= limit)


if triton is not None:

    @triton.jit(do_not_specialize=["num_pairs"])
    def _gate_up_swiglu_fp8(
        x_ptr, w_ptr, s_ptr, h_ptr, sorted_ids_ptr, block_expert_ptr, num_pairs,
        stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_hp,
        HIDDEN: tl.constexpr, INNER: tl.constexpr, TOP_K: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACT_FP8: tl.constexpr,
    ):
        expert = tl.load(block_expert_ptr + tl.program_id(0))
        if expert < 0:
            return
        rows, row_ok = _block_rows(sorted_ids_ptr, num_pairs, BLOCK_M)
        token = tl.where(row_ok, rows // TOP_K, 0)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < INNER
        k = tl.arange(0, 128)
        a_ptrs = x_ptr + token[:, None].to(tl.int64) * stride_xt + k[None, :]
        g_ptrs = w_ptr + expert.to(tl.int64) * stride_we + n[None, :] * stride_wn + k[:, None]
        u_ptrs = g_ptrs + INNER * stride_wn
        gs_ptrs = s_ptr + expert.to(tl.int64) * stride_se + (n // 128) * stride_sn
        us_ptrs = s_ptr + expert.to(tl.int64) * stride_se + ((n + INNER) // 128) * stride_sn
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for kb in range(0, HIDDEN // 128):
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
            q, scale_a = quant_group(a, ACT_FP8)
            g = tl.load(g_ptrs, mask=n_ok[None, :], other=0.0)
            u = tl.load(u_ptrs, mask=n_ok[None, :], other=0.0)
            sg = tl.load(gs_ptrs + kb, mask=n_ok, other=0.0)
            su = tl.load(us_ptrs + kb, mask=n_ok, other=0.0)
            acc_g += scaled_dot(q, g, ACT_FP8) * (scale_a[:, None] * sg[None, :])
            acc_u += scaled_dot(q, u, ACT_FP8) * (scale_a[:, None] * su[None, :])
            a_ptrs += 128
            g_ptrs += 128
            u_ptrs += 128
        h = acc_g * tl.sigmoid(acc_g) * acc_u
        tl.store(h_ptr + rows[:, None].to(tl.int64) * stride_hp + n[None, :], h.to(h_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & n_ok[None, :])

    @triton.jit(do_not_specialize=["num_pairs"])
    def _down_weighted_fp8(
        h_ptr, w_ptr, s_ptr, y_ptr, route_ptr, sorted_ids_ptr, block_expert_ptr, num_pairs,
        stride_hp, stride_we, stride_wn, stride_se, stride_sn, stride_yp,
        HIDDEN: tl.constexpr, INNER: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACT_FP8: tl.constexpr,
    ):
        expert = tl.load(block_expert_ptr + tl.program_id(0))
        if expert < 0:
            return
        rows, row_ok = _block_rows(sorted_ids_ptr, num_pairs, BLOCK_M)
        safe_rows = tl.where(row_ok, rows, 0)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < HIDDEN
        k = tl.arange(0, 128)
        a_ptrs = h_ptr + safe_rows[:, None].to(tl.int64) * stride_hp + k[None, :]
        b_ptrs = w_ptr + expert.to(tl.int64) * stride_we + n[None, :] * stride_wn + k[:, None]
        s_ptrs = s_ptr + expert.to(tl.int64) * stride_se + (n // 128) * stride_sn
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for kb in range(0, INNER // 128):
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
            q, scale_a = quant_group(a, ACT_FP8)
            b = tl.load(b_ptrs, mask=n_ok[None, :], other=0.0)
            sb = tl.load(s_ptrs + kb, mask=n_ok, other=0.0)
            acc += scaled_dot(q, b, ACT_FP8) * (scale_a[:, None] * sb[None, :])
            a_ptrs += 128
            b_ptrs += 128
        route = tl.load(route_ptr + safe_rows, mask=row_ok, other=0.0).to(tl.float32)
        acc = acc * route[:, None]
        tl.store(y_ptr + safe_rows[:, None].to(tl.int64) * stride_yp + n[None, :], acc,
                 mask=row_ok[:, None] & n_ok[None, :])


def _check(x, chosen, gate_up, gate_up_scale, down, down_scale) -> None:
    experts, two_inner, hidden = gate_up.shape
    inner = two_inner // 2
    if gate_up.dtype != E4M3 or down.dtype != E4M3:
        raise moe_triton.MoeInputError(f"FP8 experts must be e4m3, got {gate_up.dtype}/{down.dtype}")
    if hidden != x.shape[1] or down.shape != (experts, hidden, inner) or hidden % GROUP or inner % GROUP:
        raise moe_triton.MoeInputError(f"FP8 experts want gate_up [E, 2I, H], down [E, H, I], H and I multiples of "
                                       f"{GROUP}; got {tuple(gate_up.shape)}, {tuple(down.shape)}, x {tuple(x.shape)}")
    want = ((experts, two_inner // GROUP, hidden // GROUP), (experts, hidden // GROUP, inner // GROUP))
    if (tuple(gate_up_scale.shape), tuple(down_scale.shape)) != want:
        raise moe_triton.MoeInputError(f"FP8 expert scales {tuple(gate_up_scale.shape)}, {tuple(down_scale.shape)}; "
                                       f"want {want}")
    if x.dim() != 2 or chosen.dim() != 2 or chosen.shape[0] != x.shape[0]:
        raise moe_triton.MoeInputError(f"want x [T, H], chosen [T, k]; got {tuple(x.shape)}, {tuple(chosen.shape)}")


def fused_fp8_experts(x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor, gate_up: torch.Tensor,
                      gate_up_scale: torch.Tensor, down: torch.Tensor, down_scale: torch.Tensor,
                      config: Fp8MoeConfig | None = None, act_fp8: bool = True) -> torch.Tensor:
    """SwiGLU FP8 experts: `x` [T, H]; `weights`, `chosen` [T, k]; e4m3 `gate_up` [E, 2I, H] with float32
    scales [E, 2I/128, H/128]; `down` [E, H, I] with [E, H/128, I/128] -> [T, H] in x's dtype.
    `act_fp8=False`: float32 activations (the interpreter check, see `fp8_gemm.quant_group`)."""
    _check(x, chosen, gate_up, gate_up_scale, down, down_scale)
    if triton is None:
        raise RuntimeError("triton is not installed")
    tokens, top_k = chosen.shape
    experts, two_inner, hidden = gate_up.shape
    inner = two_inner // 2
    pairs = tokens * top_k
    out = torch.empty_like(x)
    if pairs == 0:
        return out
    cfg = config or pick_config(pairs)
    x = x if x.stride(-1) == 1 else x.contiguous()
    gate_up_scale, down_scale = gate_up_scale.contiguous(), down_scale.contiguous()
    sorted_ids, block_expert = moe_triton.layout(chosen, experts, cfg.block_m)
    route = weights.reshape(-1).contiguous()
    h = torch.empty(pairs, inner, dtype=x.dtype, device=x.device)
    y = torch.empty(pairs, hidden, dtype=torch.float32, device=x.device)
    n_blocks = block_expert.numel()
    launch = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    _gate_up_swiglu_fp8[(n_blocks, triton.cdiv(inner, cfg.block_n))](
        x, gate_up, gate_up_scale, h, sorted_ids, block_expert, pairs,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), gate_up_scale.stride(0), gate_up_scale.stride(1), h.stride(0),
        HIDDEN=hidden, INNER=inner, TOP_K=top_k, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, ACT_FP8=act_fp8, **launch)
    _down_weighted_fp8[(n_blocks, triton.cdiv(hidden, cfg.down_block_n))](
        h, down, down_scale, y, route, sorted_ids, block_expert, pairs,
        h.stride(0), down.stride(0), down.stride(1), down_scale.stride(0), down_scale.stride(1), y.stride(0),
        HIDDEN=hidden, INNER=inner, BLOCK_M=cfg.block_m, BLOCK_N=cfg.down_block_n, ACT_FP8=act_fp8, **launch)
    block = min(1024, triton.next_power_of_2(hidden))
    _sum_top_k[(tokens, triton.cdiv(hidden, block))](y, out, y.stride(0), out.stride(0),
                                                   HIDDEN=hidden, TOP_K=top_k, BLOCK=block)
    return out
