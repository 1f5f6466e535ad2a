"""A Triton paged-attention decode kernel on the engine's KV layout
`[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]`.

One program per (sequence, KV head) computes all query heads of its GQA group: it walks the
sequence's block table up to `seq_lens[b]`, `PAGE_TOKENS` tokens (whole blocks) an iteration,
reading each block's keys/values once, with an online softmax in float32 (flash-decoding without
the split: at decode the cost is the bytes read; a tile of several blocks keeps more loads in
flight per dependent step, which is what a short context at small batch waits on). It reads only the blocks a sequence owns, so a CUDA graph captured for the whole
`max_model_len` costs no more than the context in use. No host syncs (graph-safe).

Used by the engine when `attention_backend="triton"` for pure decode steps; prefill and mixed
steps stay on torch SDPA. Where Triton or CUDA is missing, `triton_decode_kernel` returns None
and the torch path runs (TRITON_INTERPRET=1 runs the kernel on CPU, for tests).
"""

from __future__ import annotations

import logging

import torch

from omni import env

log = logging.getLogger("omni.ar.triton")

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None


if triton is not None:

    @triton.jit
    def _paged_decode(
        q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, seq_lens_ptr, scale, table_width,
        stride_qb, stride_qh, stride_blk, stride_slot, stride_kvh, stride_tb, stride_ob, stride_oh,
        GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, PAGES: tl.constexpr, MAX_TILES: tl.constexpr, IEEE: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        tok = tl.arange(0, PAGES * BLOCK_SIZE)  # a tile's tokens: PAGES cache blocks of the sequence
        page, slot = tok // BLOCK_SIZE, tok % BLOCK_SIZE
        g_ok = g < GROUP
        d_ok = d < HEAD_DIM
        heads = kvh * GROUP + g
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                    mask=g_ok[:, None] & d_ok[None, :], other=0.0)
        seq_len = tl.load(seq_lens_ptr + b)
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for j in range(0, MAX_TILES):  # a fixed trip count (graphs); tiles past seq_len are skipped
            if j * PAGES * BLOCK_SIZE < seq_len:
                pos = j * PAGES * BLOCK_SIZE + tok
                inside = pos < seq_len
                block = tl.load(tables_ptr + b * stride_tb + j * PAGES + page,
                                mask=inside & (j * PAGES + page < table_width), other=0)
                offs = block[:, None] * stride_blk + slot[:, None] * stride_slot + kvh * stride_kvh + d[None, :]
                # slots past seq_len hold an earlier owner's values (NaN or inf too): never load
                # them, since p = 0 there and 0 * NaN would still be NaN
                live = inside[:, None] & d_ok[None, :]
                k = tl.load(k_ptr + offs, mask=live, other=0.0)
                v = tl.load(v_ptr + offs, mask=live, other=0.0)
                if IEEE:
                    scores = tl.dot(q, tl.trans(k), input_precision="ieee")
                else:
                    scores = tl.dot(q, tl.trans(k))
                scores = tl.where(inside[None, :], scores * scale, float("-inf"))
                m_new = tl.maximum(m, tl.max(scores, 1))
                p = tl.exp(scores - m_new[:, None])
                alpha = tl.exp(m - m_new)
                l = l * alpha + tl.sum(p, 1)
                if IEEE:
                    pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
                else:
                    pv = tl.dot(p.to(v.dtype), v)
                acc = acc * alpha[:, None] + pv
                m = m_new
        out = acc / l[:, None]
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


PAGE_TOKENS = 64  # tokens a program reads per iteration (whole cache blocks): fewer dependent loads a step


def _pow2(n: int, least: int = 16) -> int:
    p = least
    while p < n:
        p *= 2
    return p


def paged_decode_attention(kv_cache: torch.Tensor, layer: int, q: torch.Tensor, block_tables: torch.Tensor,
                           seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, Hq, D] (one new token per sequence, its k/v already in the cache) -> [B, Hq, D]."""
    _, _, _, block_size, hkv, dim = kv_cache.shape
    batch, hq, _ = q.shape
    group = hq // hkv
    k_cache, v_cache = kv_cache[layer, 0], kv_cache[layer, 1]
    q = q.to(kv_cache.dtype).contiguous()
    out = torch.empty_like(q)
    tables = block_tables if block_tables.is_contiguous() else block_tables.contiguous()
    pages = max(1, PAGE_TOKENS // block_size)
    _paged_decode[(batch, hkv)](
        q, k_cache, v_cache, out, tables, seq_lens, float(scale), tables.shape[1],
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, BLOCK_G=_pow2(group), HEAD_DIM=dim, BLOCK_D=_pow2(dim), BLOCK_SIZE=block_size,
        PAGES=pages, MAX_TILES=_pow2(-(-tables.shape[1] // pages), 1), IEEE=kv_cache.dtype == torch.float32,
    )
    return out


def _unusable_because(kv_cache: torch.Tensor) -> str | None:
    """Why `paged_decode_attention` cannot run on this cache, or None."""
    if triton is None:
        return "triton is not installed"
    if not (kv_cache.is_cuda or env.triton_interpret()):
        return "the KV cache is not on a CUDA device"
    if kv_cache.shape[3] < 16 or kv_cache.shape[3] & (kv_cache.shape[3] - 1):
        return f"block_size {kv_cache.shape[3]} is not a power of two >= 16"
    return None


def triton_decode_usable(kv_cache: torch.Tensor) -> bool:
    """The kernel runs on this CUDA cache: what `attention_backend="auto"` asks (never the interpreter)."""
    return kv_cache.is_cuda and _unusable_because(kv_cache) is None


def triton_decode_kernel(kv_cache: torch.Tensor):
    """`paged_decode_attention` when it can run on this cache, else None (with a warning)."""
    why = _unusable_because(kv_cache)
    if why:
        log.warning("attention_backend='triton' unavailable (%s): using torch attention", why)
        return None
    return paged_decode_attention
