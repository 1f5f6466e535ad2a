"""Fused Triton kernels for a small dense decoder's per-frame loop (the talker's code predictor).

The code predictor runs 15 dependent decode steps per audio frame over 5 layers; unfused, each
step is ~150 small kernels (norms, projections, rope, attention, the sampler's ~50 elementwise
ops), so even replayed from one CUDA graph a frame is launch-bound (8.5 ms on an H200 for
weights that need ~0.5 ms of HBM time). Four kernels make a step ~27 launches:

- `linear`: out = [residual +] epilogue(prologue(x) @ W^T [+ bias]), the prologue an RMSNorm of the
  row (`norm_weight`), the epilogue SwiGLU's silu(gate) * up over (gate, up) column pairs (`glu`);
  all rows of the batch in one program per output tile, so the weights are read once per call, and K
  split over several programs where one would be latency-bound (partial sums added in a fixed order
  by the tile's last program: deterministic);
- `static_attention`: per (row, kv head) the new positions' q/k RMSNorm + rotate-half RoPE, the
  k/v written into a preallocated [B, kv_heads, L, D] cache, and causal attention of the new
  queries over the cache (GQA: the kv head serves its group of query heads);
- `sample_embed`: one program per row: greedy argmax, or temperature / top-k / top-p and an
  exponential race on the sampler's hashed noise (`sampler.uniform_noise`, bit for bit), then
  the chosen code's embedding row gathered into the frame's outputs; the top-k and top-p thresholds
  found by radix select over order-preserving integer keys (no sort of the row).

Roundings follow the eager modules (RMSNorm rounds the normalised row then the weight product;
silu and the gate product round to the dtype; the bias is added before the one rounding of a
projection; residual sums round once), so bf16 results differ from the eager path only by
reduction order. No host syncs: every kernel is graph-safe. On a CPU these kernels run only in
triton's interpreter (tests); callers keep the eager path there.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None

_M31 = 0x7FFFFFFF


def available(x: torch.Tensor) -> bool:
    """The kernels can run on `x`: CUDA with triton, or triton's interpreter (TRITON_INTERPRET=1)."""
    if triton is None:
        return False
    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:
    from omni.layers.fused_ops import head_norm_rope_values

    @triton.jit
    def _linear_kernel(x_ptr, w_ptr, nw_ptr, b_ptr, r_ptr, o_ptr, ws_ptr, cnt_ptr, M, N, stride_xm, stride_rm,
                       stride_om, eps, K: tl.constexpr, NORM: tl.constexpr, GLU: tl.constexpr, BIAS: tl.constexpr,
                       RESID: tl.constexpr, IEEE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       SPLIT: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        pid_k = tl.program_id(2)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        mmask = rm < M
        nmask = rn < N
        dt = o_ptr.dtype.element_ty
        x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
        inv = tl.zeros([BM], dtype=tl.float32)
        if NORM:
            ss = tl.zeros([BM], dtype=tl.float32)
            for k0 in range(0, K, BK):
                rk = k0 + tl.arange(0, BK)
                xt = tl.load(x_rows + rk[None, :], mask=mmask[:, None] & (rk < K)[None, :], other=0.0).to(tl.float32)
                ss += tl.sum(xt * xt, axis=1)
            inv = tl.rsqrt(ss / K + eps)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        KS: tl.constexpr = K // SPLIT  # this program's share of the reduction
        for k0 in range(0, KS, BK):
            rk = pid_k * KS + k0 + tl.arange(0, BK)
            kmask = rk < K
            xmask = mmask[:, None] & kmask[None, :]
            a = tl.load(x_rows + rk[None, :], mask=xmask, other=0.0)
            if NORM:
                nw = tl.load(nw_ptr + rk, mask=kmask, other=0.0).to(tl.float32)
                normed = (a.to(tl.float32) * inv[:, None]).to(dt).to(tl.float32)
                a = (nw[None, :] * normed).to(dt)
            w = tl.load(w_ptr + rn.to(tl.int64)[:, None] * K + rk[None, :], mask=nmask[:, None] & kmask[None, :],
                        other=0.0)
            if IEEE:
                acc += tl.dot(a, tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(a, tl.trans(w))
        if SPLIT == 1:
            _linear_epilogue(acc, b_ptr, r_ptr, o_ptr, rm, rn, mmask, nmask, N, stride_rm, stride_om, BIAS, RESID, GLU, BN)
        else:  # split-K: partial sums to the workspace; the tile's last program adds them in a fixed order
            tile = pid_m * tl.num_programs(0) + pid_n
            tiles = tl.num_programs(0) * tl.num_programs(1)
            loc = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
            tl.store(ws_ptr + (pid_k * tiles + tile).to(tl.int64) * (BM * BN) + loc, acc)
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT - 1:
                total = tl.zeros([BM, BN], dtype=tl.float32)
                for s in tl.static_range(SPLIT):
                    total += tl.load(ws_ptr + (s * tiles + tile).to(tl.int64) * (BM * BN) + loc, cache_modifier=".cg")
                tl.atomic_xchg(cnt_ptr + tile, 0)  # ready for the next call (and the next graph replay)
                _linear_epilogue(total, b_ptr, r_ptr, o_ptr, rm, rn, mmask, nmask, N, stride_rm, stride_om, BIAS,
                                 RESID, GLU, BN)

    @triton.jit
    def _linear_epilogue(acc, b_ptr, r_ptr, o_ptr, rm, rn, mmask, nmask, N, stride_rm, stride_om, BIAS: tl.constexpr,
                         RESID: tl.constexpr, GLU: tl.constexpr, BN: tl.constexpr):
        """[residual +] (acc [+ bias]) rounded once to the output dtype, stored. With GLU the columns are
        (gate, up) pairs and silu(gate) * up goes to column pair // 2, each step rounded as torch rounds it."""
        dt = o_ptr.dtype.element_ty
        if BIAS:
            acc += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
        y = acc.to(dt)
        if GLU:
            gate, up = tl.split(tl.reshape(y.to(tl.float32), (y.shape[0], BN // 2, 2)))
            y = ((gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32) * up).to(dt)
            rn = tl.program_id(0) * (BN // 2) + tl.arange(0, BN // 2)  # BN is even: no pair straddles tiles
            nmask = rn < N // 2
        omask = mmask[:, None] & nmask[None, :]
        if RESID:
            r = tl.load(r_ptr + rm.to(tl.int64)[:, None] * stride_rm + rn[None, :], mask=omask, other=0.0)
            y = (r.to(tl.float32) + y.to(tl.float32)).to(dt)
        tl.store(o_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :], y, mask=omask)

    @triton.jit
    def _norm_rope(src, w_ptr, c1, c2, s1, s2, offs, mask, eps, HALF: tl.constexpr):
        """`fused_ops.head_norm_rope_values`, rounded to the source dtype (kept as float32)."""
        dt = src.dtype.element_ty
        o1, o2 = head_norm_rope_values(src, w_ptr, c1, c2, s1, s2, offs, mask, eps, HALF)
        return o1.to(dt).to(tl.float32), o2.to(dt).to(tl.float32)

    @triton.jit
    def _rope_row(cos_ptr, sin_ptr, pos, stride, offs, mask, HALF: tl.constexpr):
        """Both halves of the cos and sin rows of position `pos`, float32."""
        c1 = tl.load(cos_ptr + pos * stride + offs, mask=mask, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + pos * stride + HALF + offs, mask=mask, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + pos * stride + offs, mask=mask, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + pos * stride + HALF + offs, mask=mask, other=0.0).to(tl.float32)
        return c1, c2, s1, s2

    @triton.jit
    def _attention_kernel(qkv_ptr, k_cache, v_cache, qw_ptr, kw_ptr, cos_ptr, sin_ptr, out_ptr, start,
                          stride_qkv, stride_out, stride_cb, stride_ch, stride_cl, stride_cs, eps, scale,
                          T: tl.constexpr, Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HALF: tl.constexpr,
                          BLOCK_HALF: tl.constexpr, BLOCK_L: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        kvh = tl.program_id(1)
        D: tl.constexpr = 2 * HALF
        GROUP: tl.constexpr = Q_HEADS // KV_HEADS
        dt = out_ptr.dtype.element_ty
        offs = tl.arange(0, BLOCK_HALF)
        hmask = offs < HALF
        kc = k_cache + b * stride_cb + kvh * stride_ch
        vc = v_cache + b * stride_cb + kvh * stride_ch
        for t in tl.static_range(T):  # the new positions: k normed + roped, v as is, into the cache
            row = qkv_ptr + (b * T + t) * stride_qkv
            pos = start + t
            c1, c2, s1, s2 = _rope_row(cos_ptr, sin_ptr, pos, stride_cs, offs, hmask, HALF)
            k1, k2 = _norm_rope(row + Q_HEADS * D + kvh * D, kw_ptr, c1, c2, s1, s2, offs, hmask, eps, HALF)
            tl.store(kc + pos * stride_cl + offs, k1.to(dt), mask=hmask)
            tl.store(kc + pos * stride_cl + HALF + offs, k2.to(dt), mask=hmask)
            v_src = row + (Q_HEADS + KV_HEADS) * D + kvh * D
            tl.store(vc + pos * stride_cl + offs, tl.load(v_src + offs, mask=hmask, other=0.0), mask=hmask)
            tl.store(vc + pos * stride_cl + HALF + offs, tl.load(v_src + HALF + offs, mask=hmask, other=0.0),
                     mask=hmask)
        tl.debug_barrier()  # the block's own cache writes are read back below
        lofs = tl.arange(0, BLOCK_L)
        length = start + T
        lmask = lofs < length
        cmask = lmask[:, None] & hmask[None, :]
        k1s = tl.load(kc + lofs[:, None] * stride_cl + offs[None, :], mask=cmask, other=0.0).to(tl.float32)
        k2s = tl.load(kc + lofs[:, None] * stride_cl + HALF + offs[None, :], mask=cmask, other=0.0).to(tl.float32)
        v1s = tl.load(vc + lofs[:, None] * stride_cl + offs[None, :], mask=cmask, other=0.0).to(tl.float32)
        v2s = tl.load(vc + lofs[:, None] * stride_cl + HALF + offs[None, :], mask=cmask, other=0.0).to(tl.float32)
        for t in tl.static_range(T):
            row = qkv_ptr + (b * T + t) * stride_qkv
            pos = start + t
            c1, c2, s1, s2 = _rope_row(cos_ptr, sin_ptr, pos, stride_cs, offs, hmask, HALF)
            for j in tl.static_range(GROUP):
                qh = kvh * GROUP + j
                q1, q2 = _norm_rope(row + qh * D, qw_ptr, c1, c2, s1, s2, offs, hmask, eps, HALF)
                s = (tl.sum(k1s * q1[None, :], axis=1) + tl.sum(k2s * q2[None, :], axis=1)) * scale
                s = tl.where(lofs <= pos, s, float("-inf"))
                p = tl.exp(s - tl.max(s, axis=0))
                p = p / tl.sum(p, axis=0)
                o1 = tl.sum(p[:, None] * v1s, axis=0)
                o2 = tl.sum(p[:, None] * v2s, axis=0)
                dst = out_ptr + (b * T + t) * stride_out + qh * D
                tl.store(dst + offs, o1.to(dt), mask=hmask)
                tl.store(dst + HALF + offs, o2.to(dt), mask=hmask)

    @triton.jit
    def _mix32(x):
        """`sampler._mix32`: int64 holding [0, 2^32), the same integers on every device."""
        x = x ^ (x >> 16)
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x = x ^ (x >> 15)
        x = (x * 0x5BD1E995) & 0xFFFFFFFF
        return x ^ (x >> 16)

    @triton.jit
    def _order_keys(x):
        """int64 keys in [0, 2^32) ordered as the float32 values `x` (-inf lowest)."""
        bits = x.to(tl.int32, bitcast=True)
        return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64) + 2147483648

    @triton.jit
    def _kth_largest_key(keys, k):
        """The k-th largest of `keys`: the largest t with at least k keys >= t, built from the top bit."""
        t = tl.full([], 0, tl.int64)
        for bit in tl.static_range(31, -1, -1):
            cand = t | (1 << bit)
            t = tl.where(tl.sum((keys >= cand).to(tl.int32), axis=0) >= k, cand, t)
        return t

    @triton.jit
    def _mass_cut_key(keys, probs, limit, top):
        """The top-p cut: the largest key t whose lower keys hold at most `limit` of the mass (the
        smallest kept value's key), never above `top` (the best row always stays)."""
        t = tl.full([], 0, tl.int64)
        for bit in tl.static_range(31, -1, -1):
            cand = t | (1 << bit)
            t = tl.where(tl.sum(tl.where(keys < cand, probs, 0.0), axis=0) <= limit, cand, t)
        return tl.minimum(t, top)

    @triton.jit
    def _sample_embed_kernel(logits_ptr, temp_ptr, seed_ptr, frame_ptr, emb_ptr, codes_ptr, embeds_ptr, next_ptr,
                             stride_l, stride_codes, stride_embeds, stride_next, top_k, top_p,
                             group, groups_per_frame, V,
                             H: tl.constexpr, BV: tl.constexpr, BH: tl.constexpr, HAS_NEXT: tl.constexpr,
                             RADIX: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BV)
        vmask = offs < V
        logits = tl.load(logits_ptr + b * stride_l + offs, mask=vmask, other=float("-inf")).to(tl.float32)
        best = tl.max(logits, axis=0)
        greedy = tl.min(tl.where(logits == best, offs, BV), axis=0)  # torch.argmax: the first maximum
        t = tl.load(temp_ptr + b)
        x = logits / tl.where(t > 0, t, 1.0)
        # top-k then top-p as `sampler.warp` (value thresholds: ties at a threshold are kept)
        k = tl.where((top_k <= 0) | (top_k > V), V, top_k)
        if RADIX:  # no sort: the k-th largest and the top-p cut found bit by bit over order keys
            keys = _order_keys(x)
            kth_key = _kth_largest_key(keys, k)
            s = tl.where(keys >= kth_key, x, float("-inf"))
            e = tl.exp(s - tl.max(s, axis=0))
            cut_key = _mass_cut_key(keys, e / tl.sum(e, axis=0), 1.0 - top_p, tl.max(keys, axis=0))
            x = tl.where((keys >= cut_key) & vmask, x, float("-inf"))
        else:
            srt = tl.sort(x)  # ascending; the BV - V padding lanes (-inf) come first
            kth = tl.max(tl.where(offs == BV - k, srt, float("-inf")), axis=0)
            s = tl.where(srt < kth, float("-inf"), srt)
            e = tl.exp(s - tl.max(s, axis=0))
            cum = tl.cumsum(e / tl.sum(e, axis=0), axis=0)
            remove = (cum <= 1.0 - top_p) & (offs < BV - 1)
            cut = tl.min(tl.where(remove | (s == float("-inf")), float("inf"), s), axis=0)
            x = tl.where((x >= cut) & vmask, x, float("-inf"))
        e = tl.exp(x - tl.max(x, axis=0))
        probs = e / tl.sum(e, axis=0)
        # the race: argmax p_i / E_i, E_i = -log(u_i), u from (seed, draw counter, token id)
        seed = tl.load(seed_ptr + b)
        counter = tl.load(frame_ptr + b) * groups_per_frame + group
        rowh = _mix32((seed & 0x7FFFFFFF) ^ _mix32((counter & 0x7FFFFFFF) ^ 0x2545F491))
        h = _mix32((rowh + offs.to(tl.int64) * 0x9E3779B1) & 0xFFFFFFFF)
        u = ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
        score = tl.where(vmask, probs / -tl.log(u), -1.0)
        top = tl.max(score, axis=0)
        sampled = tl.min(tl.where(score == top, offs, BV), axis=0)
        code = tl.where(t > 0, sampled, greedy)
        tl.store(codes_ptr + b * stride_codes, code.to(tl.int64))
        hofs = tl.arange(0, BH)
        src = emb_ptr + code.to(tl.int64) * H
        for h0 in range(0, H, BH):
            hm = (h0 + hofs) < H
            row = tl.load(src + h0 + hofs, mask=hm, other=0.0)
            tl.store(embeds_ptr + b * stride_embeds + h0 + hofs, row, mask=hm)
            if HAS_NEXT:
                tl.store(next_ptr + b * stride_next + h0 + hofs, row, mask=hm)


# the linear kernel's launch shapes, measured on an H200 (bench/predictor_linear_sweep.py, RESULTS
# 2026-12-02): output columns per program (bn; bn_large above 4096 columns), K per iteration, the most
# programs K is split over (a weight read by few programs is latency-bound: each keeps only a few tiles
# in flight), warps, pipeline stages for up to 16 rows / more. A call with an RMSNorm prologue does not
# split: every program of a split would compute the row's norm again.
LINEAR_TILES = {
    "norm": {"bn": 32, "bn_large": 64, "bk": 256, "split": 1, "warps": 4, "stages": 4, "stages_many": 3},
    "plain": {"bn": 32, "bn_large": 32, "bk": 128, "split": 8, "warps": 4, "stages": 3, "stages_many": 3},
}
SAMPLE_RADIX = True  # top-k / top-p by radix select (False: a sort of the row)
SAMPLE_WARPS = 4


SHARED_MEMORY = 200 << 10  # bytes of pipelined tiles a program may hold (an H100/H200 SM has 227 KB)


def linear_tiling(m: int, n: int, k: int, norm: bool, elem_size: int = 2) -> dict[str, int]:
    """The launch shape of one `linear` call: BM, BN, BK, SPLIT (a power of two dividing K / BK); fewer
    stages, then a shorter BK, where the pipelined tiles would not fit in shared memory (float32)."""
    t = LINEAR_TILES["norm" if norm else "plain"]
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    bn = t["bn_large"] if n > 4096 else t["bn"]
    bk = t["bk"] if k >= t["bk"] else 32
    stages = t["stages"] if m <= 16 else t["stages_many"]
    while stages * (bm + bn) * bk * elem_size > SHARED_MEMORY and bk > 32:
        stages, bk = (stages - 1, bk) if stages > 2 else (stages, bk // 2)
    split = 1
    while split < t["split"] and k % (2 * split * bk) == 0:
        split *= 2
    return {"BM": bm, "BN": bn, "BK": bk, "SPLIT": split, "num_warps": t["warps"], "num_stages": stages}


def split_counters(device) -> torch.Tensor:
    """Zeroed arrival counters for split-K calls (each call leaves them zeroed). One set per caller
    that may run concurrently with another (calls on one stream may share it)."""
    return torch.zeros(1 << 14, dtype=torch.int32, device=device)


def _rows_view(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"{name}: expected a 2-D tensor with unit last stride, got {tuple(x.shape)} {x.stride()}")
    return x


def linear(x: torch.Tensor, weight: torch.Tensor, *, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
           bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, glu: bool = False,
           out: torch.Tensor | None = None, counters: torch.Tensor | None = None) -> torch.Tensor:
    """[residual +] epilogue(prologue(x) @ weight.T [+ bias]): x [M, K], weight [N, K] -> [M, N]; with
    `glu` the weight's rows are (gate, up) pairs (`interleave_pairs`) and the output [M, N / 2] is
    silu(gate) * up. `counters` (`split_counters`) let a call split K over several programs."""
    x = _rows_view(x, "x")
    n, k = weight.shape
    m = x.shape[0]
    if x.shape[1] != k or not weight.is_contiguous() or (glu and n % 2):
        raise ValueError(f"linear: x {tuple(x.shape)} does not fit weight {tuple(weight.shape)} (glu={glu})")
    if out is None:
        out = torch.empty(m, n // 2 if glu else n, dtype=x.dtype, device=x.device)
    if residual is not None:
        _rows_view(residual, "residual")
    if m == 0:
        return out
    tiling = linear_tiling(m, n, k, norm_weight is not None, x.element_size())
    tiles = triton.cdiv(n, tiling["BN"]) * triton.cdiv(m, tiling["BM"])
    if counters is None or tiles > counters.numel():
        tiling["SPLIT"] = 1
    split = tiling["SPLIT"]
    ws = out if split == 1 else torch.empty(split * tiles * tiling["BM"] * tiling["BN"], dtype=torch.float32,
                                            device=x.device)
    _linear_kernel[(triton.cdiv(n, tiling["BN"]), triton.cdiv(m, tiling["BM"]), split)](
        x, weight, norm_weight if norm_weight is not None else weight, bias if bias is not None else weight,
        residual if residual is not None else out, out, ws, counters if split > 1 else out, m, n, x.stride(0),
        residual.stride(0) if residual is not None else 0, out.stride(0), eps,
        K=k, NORM=norm_weight is not None, GLU=glu, BIAS=bias is not None, RESID=residual is not None,
        IEEE=x.dtype == torch.float32, **tiling)
    return out


def interleave_pairs(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """[2N, ...] rows gate_0, up_0, gate_1, up_1, ...: the weight (or bias) layout of `linear(glu=True)`."""
    return torch.stack((gate, up), dim=1).reshape(2 * gate.shape[0], *gate.shape[1:]).contiguous()


def static_attention(qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, q_norm: torch.Tensor,
                     k_norm: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, start: int, new: int,
                     q_heads: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """qkv [B * new, (q_heads + 2 kv_heads) * D] (rows b-major) -> attention output [B * new, q_heads * D];
    positions [start, start + new) are written into keys / values [B, kv_heads, L, D] first."""
    batch, kv_heads, length, d = keys.shape
    if d % 2 or q_heads % kv_heads or start + new > length or keys.stride(3) != 1 or values.stride() != keys.stride():
        raise ValueError(f"static_attention: cache {tuple(keys.shape)}, start {start}, new {new}, q_heads {q_heads}")
    if qkv.shape != (batch * new, (q_heads + 2 * kv_heads) * d) or qkv.stride(1) != 1:
        raise ValueError(f"static_attention: qkv {tuple(qkv.shape)} for a batch of {batch} x {new}")
    if out is None:
        out = torch.empty(batch * new, q_heads * d, dtype=qkv.dtype, device=qkv.device)
    half = d // 2
    _attention_kernel[(batch, kv_heads)](
        qkv, keys, values, q_norm, k_norm, cos, sin, out, start, qkv.stride(0), out.stride(0),
        keys.stride(0), keys.stride(1), keys.stride(2), cos.stride(0), eps, d**-0.5,
        T=new, Q_HEADS=q_heads, KV_HEADS=kv_heads, HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_L=max(16, triton.next_power_of_2(length)), num_warps=4)
    return out


def sample_embed(logits: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor, frame: torch.Tensor,
                 table: torch.Tensor, codes: torch.Tensor, embeds: torch.Tensor, *, top_k: int, top_p: float,
                 group: int, groups_per_frame: int, next_input: torch.Tensor | None = None) -> None:
    """One code per row of `logits` [B, V] into `codes` [B] (greedy where temperature is 0, else
    the race with draw counter frame * groups_per_frame + group), its `table` row into `embeds`
    [B, H] (and `next_input` [B, H] when given)."""
    batch, vocab = logits.shape
    width = table.shape[1]
    if table.shape[0] != vocab or not table.is_contiguous() or embeds.shape != (batch, width):
        raise ValueError(f"sample_embed: logits {tuple(logits.shape)}, table {tuple(table.shape)}, "
                         f"embeds {tuple(embeds.shape)}")
    if batch == 0:
        return
    bv = triton.next_power_of_2(vocab)
    _sample_embed_kernel[(batch,)](
        logits, temperature, seed, frame, table, codes, embeds, next_input if next_input is not None else embeds,
        logits.stride(0), codes.stride(0), embeds.stride(0), next_input.stride(0) if next_input is not None else 0,
        int(top_k), float(top_p), int(group), int(groups_per_frame), vocab,
        H=width, BV=bv, BH=min(1024, triton.next_power_of_2(width)), HAS_NEXT=next_input is not None,
        RADIX=SAMPLE_RADIX,
        num_warps=SAMPLE_WARPS if bv <= 4096 else 2 * SAMPLE_WARPS)
