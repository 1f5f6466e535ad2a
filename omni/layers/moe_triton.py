"""Fused routed-expert MoE in Triton: reads only the chosen experts' weights, no host syncs.

Token-expert pairs are laid out by expert in blocks of BLOCK_M rows (each expert's rows padded
to a whole block; `align_pairs`). The layout is sized for the worst case of a given number of
pairs, so shapes stay static inside CUDA graphs; blocks past the used ones are skipped.
Then three launches:
1. `_gate_up_swiglu`: per (block, N tile) h = silu(x W_gate^T) * (x W_up^T) for the block's rows;
2. `_down_weighted`: per (block, N tile) y = routing weight * (h W_down^T), one row per pair;
3. `_sum_top_k`: out[t] = sum over the token's k pairs, in float32, cast to the input dtype.
Accumulation is float32 throughout. Block sizes come from a fixed table per number of pairs
(no autotune: nothing may compile inside a graph capture; the engine warms up before it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None


@dataclass(frozen=True)
class MoeConfig:
    """Tile sizes for one M bucket; `block_m` also sets the expert padding of the layout."""

    block_m: int
    block_n: int
    block_k: int
    down_block_n: int
    down_block_k: int
    num_warps: int = 4
    num_stages: int = 4


# (max token-expert pairs, config): small M is bound by weight bytes, so many narrow N tiles
# keep every SM streaming; large M (prefill) wants bigger tiles for reuse.
CONFIGS: tuple[tuple[int, MoeConfig], ...] = (
    (64, MoeConfig(16, 32, 128, 64, 128)),
    (1024, MoeConfig(16, 64, 128, 64, 128, num_stages=3)),
    (8192, MoeConfig(32, 64, 64, 64, 64)),
    (1 << 62, MoeConfig(64, 128, 64, 128, 64, num_warps=8, num_stages=3)),
)


def pick_config(num_pairs: int) -> MoeConfig:
    return next(cfg for limit, cfg in CONFIGS if num_pairs <= limit)


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound of sum_e ceil(count_e / block_m) over any routing of `num_pairs` pairs."""
    return (num_pairs + min(num_experts, num_pairs) * (block_m - 1)) // block_m


def align_pairs(chosen: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`chosen` [T, k] -> (pair id per padded row, sentinel T*k on padding; expert per block, -1 unused).

    Torch ops only (about twenty small kernels; for prefill), no host syncs: sort pairs by
    expert, count them per expert, and place each at its expert's block start plus its rank.
    """
    flat = chosen.reshape(-1)
    pairs = flat.numel()
    n_blocks = max_blocks(pairs, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.index_add_(0, flat, torch.ones_like(flat))
    blocks = (counts + block_m - 1) // block_m
    block_end = blocks.cumsum(0)
    row_start = (block_end - blocks) * block_m
    pair_start = counts.cumsum(0) - counts
    expert_sorted, order = torch.sort(flat, stable=True)
    rank = torch.arange(pairs, device=flat.device) - pair_start[expert_sorted]
    sorted_ids = torch.full((n_blocks * block_m,), pairs, dtype=torch.int32, device=flat.device)
    sorted_ids[row_start[expert_sorted] + rank] = order.to(torch.int32)
    block_expert = torch.searchsorted(block_end, torch.arange(n_blocks, device=flat.device), right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return sorted_ids, block_expert


ALIGN_ONE_PROGRAM_MAX_PAIRS = 1024  # above this, `align_pairs` (torch ops) lays the pairs out


if triton is not None:

    @triton.jit
    def _align_one_program(
        chosen_ptr, sorted_ids_ptr, block_expert_ptr,
        PAIRS, EXPERTS: tl.constexpr, N_BLOCKS,
        BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_B: tl.constexpr,
        BLOCK_P: tl.constexpr,
    ):
        """`align_pairs` in one launch (decode sizes): counts and in-expert ranks from one-hot
        [CHUNK, E] tiles, a running per-expert carry between chunks. The pair and block counts
        are runtime values, the loops bounded by their powers of two BLOCK_P and BLOCK_B: one compile
        per power-of-two bucket, not one per prompt length (first requests compiled anew)."""
        e = tl.arange(0, BLOCK_E)
        counts = tl.zeros([BLOCK_E], dtype=tl.int32)
        for p0 in range(0, BLOCK_P, CHUNK):
            p = p0 + tl.arange(0, CHUNK)
            ids = tl.load(chosen_ptr + p, mask=p < PAIRS, other=BLOCK_E).to(tl.int32)
            counts += tl.sum((ids[:, None] == e[None, :]).to(tl.int32), 0)
        blocks = (counts + BLOCK_M - 1) // BLOCK_M
        block_end = tl.cumsum(blocks, 0)
        row_start = (block_end - blocks) * BLOCK_M
        for r0 in range(0, BLOCK_B * BLOCK_M, CHUNK):  # padding rows hold the sentinel PAIRS
            r = r0 + tl.arange(0, CHUNK)
            tl.store(sorted_ids_ptr + r, tl.zeros([CHUNK], tl.int32) + PAIRS, mask=r < N_BLOCKS * BLOCK_M)
        tl.debug_barrier()
        seen = tl.zeros([BLOCK_E], dtype=tl.int32)
        for p0 in range(0, BLOCK_P, CHUNK):
            p = p0 + tl.arange(0, CHUNK)
            ids = tl.load(chosen_ptr + p, mask=p < PAIRS, other=BLOCK_E).to(tl.int32)
            onehot = (ids[:, None] == e[None, :]).to(tl.int32)
            rank = tl.cumsum(onehot, 0) - 1 + seen[None, :]
            pos = tl.sum(onehot * (rank + row_start[None, :]), 1)
            tl.store(sorted_ids_ptr + pos, p.to(tl.int32), mask=p < PAIRS)
            seen += tl.sum(onehot, 0)
        b = tl.arange(0, BLOCK_B)
        expert = tl.sum((block_end[None, :] <= b[:, None]).to(tl.int32), 1)
        tl.store(block_expert_ptr + b, tl.where(expert < EXPERTS, expert, -1), mask=b < N_BLOCKS)

    @triton.jit
    def _block_rows(sorted_ids_ptr, num_pairs, BLOCK_M: tl.constexpr):
        """This program's BLOCK_M token-expert pair rows, and which are real (not block padding)."""
        rows = tl.load(sorted_ids_ptr + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M))
        return rows, rows < num_pairs

    @triton.jit
    def _dot(a, b, acc, IEEE: tl.constexpr):
        """acc + a @ b; IEEE: exact float32 products (the interpreter and float32 tests)."""
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        return acc

    @triton.jit(do_not_specialize=["num_pairs"])
    def _gate_up_swiglu(
        x_ptr, w_ptr, h_ptr, sorted_ids_ptr, block_expert_ptr, num_pairs,
        stride_xt, stride_we, stride_wn, stride_hp,
        HIDDEN: tl.constexpr, INNER: tl.constexpr, TOP_K: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
    ):
        expert = tl.load(block_expert_ptr + tl.program_id(0))
        if expert < 0:
            return
        rows, row_ok = _block_rows(sorted_ids_ptr, num_pairs, BLOCK_M)
        token = tl.where(row_ok, rows // TOP_K, 0)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < INNER
        k = tl.arange(0, BLOCK_K)
        a_ptrs = x_ptr + token[:, None] * stride_xt + k[None, :]
        g_ptrs = w_ptr + expert.to(tl.int64) * stride_we + n[None, :] * stride_wn + k[:, None]
        u_ptrs = g_ptrs + INNER * stride_wn
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, HIDDEN, BLOCK_K):
            k_ok = k < HIDDEN - k0
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            g = tl.load(g_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            u = tl.load(u_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc_g = _dot(a, g, acc_g, IEEE)
            acc_u = _dot(a, u, acc_u, IEEE)
            a_ptrs += BLOCK_K
            g_ptrs += BLOCK_K
            u_ptrs += BLOCK_K
        h = acc_g * tl.sigmoid(acc_g) * acc_u
        tl.store(h_ptr + rows[:, None] * stride_hp + n[None, :], h.to(h_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & n_ok[None, :])

    @triton.jit(do_not_specialize=["num_pairs"])
    def _down_weighted(
        h_ptr, w_ptr, y_ptr, route_ptr, sorted_ids_ptr, block_expert_ptr, num_pairs,
        stride_hp, stride_we, stride_wn, stride_yp,
        HIDDEN: tl.constexpr, INNER: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
    ):
        expert = tl.load(block_expert_ptr + tl.program_id(0))
        if expert < 0:
            return
        rows, row_ok = _block_rows(sorted_ids_ptr, num_pairs, BLOCK_M)
        safe_rows = tl.where(row_ok, rows, 0)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < HIDDEN
        k = tl.arange(0, BLOCK_K)
        a_ptrs = h_ptr + safe_rows[:, None] * stride_hp + k[None, :]
        b_ptrs = w_ptr + expert.to(tl.int64) * stride_we + n[None, :] * stride_wn + k[:, None]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, INNER, BLOCK_K):
            k_ok = k < INNER - k0
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc = _dot(a, b, acc, IEEE)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
        route = tl.load(route_ptr + safe_rows, mask=row_ok, other=0.0).to(tl.float32)
        acc = acc * route[:, None]
        tl.store(y_ptr + safe_rows[:, None] * stride_yp + n[None, :], acc, mask=row_ok[:, None] & n_ok[None, :])

    @triton.jit
    def _sum_top_k(y_ptr, out_ptr, stride_yp, stride_ot, HIDDEN: tl.constexpr, TOP_K: tl.constexpr,
                   BLOCK: tl.constexpr):
        t = tl.program_id(0)
        n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = n < HIDDEN
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for j in range(TOP_K):
            acc += tl.load(y_ptr + (t * TOP_K + j) * stride_yp + n, mask=ok, other=0.0)
        tl.store(out_ptr + t * stride_ot + n, acc.to(out_ptr.dtype.element_ty), mask=ok)


def layout(chosen: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`align_pairs`' result; one Triton launch at decode sizes, torch ops above."""
    pairs = chosen.numel()
    if pairs > ALIGN_ONE_PROGRAM_MAX_PAIRS or triton is None:
        return align_pairs(chosen, num_experts, block_m)
    n_blocks = max_blocks(pairs, num_experts, block_m)
    sorted_ids = torch.empty(n_blocks * block_m, dtype=torch.int32, device=chosen.device)
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device=chosen.device)
    _align_one_program[(1,)](
        chosen.contiguous(), sorted_ids, block_expert, PAIRS=pairs, EXPERTS=num_experts, N_BLOCKS=n_blocks,
        BLOCK_M=block_m, CHUNK=64, BLOCK_E=triton.next_power_of_2(num_experts),
        BLOCK_B=triton.next_power_of_2(n_blocks), BLOCK_P=max(64, triton.next_power_of_2(pairs)), num_warps=8)
    return sorted_ids, block_expert


class MoeInputError(ValueError):
    """Shapes or dtypes the fused kernels do not take."""


def _check(x, weights, chosen, gate_up, down) -> None:
    if x.dim() != 2 or chosen.dim() != 2 or weights.shape != chosen.shape or chosen.shape[0] != x.shape[0]:
        raise MoeInputError(f"want x [T, H], weights/chosen [T, k]; got {tuple(x.shape)}, "
                            f"{tuple(weights.shape)}, {tuple(chosen.shape)}")
    experts, two_inner, hidden = gate_up.shape
    if hidden != x.shape[1] or two_inner % 2 or down.shape != (experts, hidden, two_inner // 2):
        raise MoeInputError(f"want gate_up [E, 2I, H], down [E, H, I] with H={x.shape[1]}; "
                            f"got {tuple(gate_up.shape)}, {tuple(down.shape)}")
    if gate_up.dtype != x.dtype or down.dtype != x.dtype:
        raise MoeInputError(f"weights {gate_up.dtype}/{down.dtype} differ from activations {x.dtype}")
    if gate_up.stride(-1) != 1 or down.stride(-1) != 1:
        raise MoeInputError("expert weights must be contiguous in their last dimension")


def fused_routed_experts(
    x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
    config: MoeConfig | None = None,
) -> torch.Tensor:
    """SwiGLU experts: `x` [T, H]; `weights`, `chosen` [T, k]; `gate_up` [E, 2I, H]; `down` [E, H, I] -> [T, H]."""
    _check(x, weights, chosen, gate_up, down)
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
    sorted_ids, block_expert = layout(chosen, experts, cfg.block_m)
    route = weights.reshape(-1).contiguous()
    h = torch.empty(pairs, inner, dtype=x.dtype, device=x.device)
    y = torch.empty(pairs, hidden, dtype=torch.float32, device=x.device)
    ieee = x.dtype == torch.float32
    n_blocks = block_expert.numel()
    launch = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    _gate_up_swiglu[(n_blocks, triton.cdiv(inner, cfg.block_n))](
        x, gate_up, h, sorted_ids, block_expert, pairs,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), h.stride(0),
        HIDDEN=hidden, INNER=inner, TOP_K=top_k,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, IEEE=ieee, **launch)
    _down_weighted[(n_blocks, triton.cdiv(hidden, cfg.down_block_n))](
        h, down, y, route, sorted_ids, block_expert, pairs,
        h.stride(0), down.stride(0), down.stride(1), y.stride(0),
        HIDDEN=hidden, INNER=inner,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.down_block_n, BLOCK_K=cfg.down_block_k, IEEE=ieee, **launch)
    block = min(1024, triton.next_power_of_2(hidden))
    _sum_top_k[(tokens, triton.cdiv(hidden, block))](y, out, y.stride(0), out.stride(0),
                                                   HIDDEN=hidden, TOP_K=top_k, BLOCK=block)
    return out
