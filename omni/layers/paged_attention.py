"""Attention over the paged KV cache, in pure torch (CPU and CUDA).

Cache layout: one tensor `[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]`
(index 0 = keys, 1 = values), the layout paged-attention kernels (vLLM / FlashInfer
"NHD") consume, so a GPU kernel can replace `paged_attention` without touching the cache.

Per step the runner builds one `AttentionMetadata` for all layers. `paged_attention`
writes the step's keys/values at `slot_mapping`, gathers each sequence's context through
its block table, and runs SDPA with a per-sequence causal mask, so prefill chunks and
decodes of different lengths share one batch. For CUDA graphs a decode step needs only
fixed-shape tensors (`slot_mapping`, `block_tables`, `seq_lens`: [B] / [B, max_blocks]);
they are all built in `AttentionMetadata.build`, the one place to pad them to a captured
batch size later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from omni.layers.attention import sdpa


def allocate_kv_cache(
    num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype, device
) -> torch.Tensor:
    return torch.zeros(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)


@dataclass
class AttentionMetadata:
    """Where this step's tokens go in the cache and what each query may see."""

    slot_mapping: torch.Tensor  # [T] cache slot of each new token
    block_tables: torch.Tensor  # [B, max_blocks] (padded with block 0; masked out)
    seq_lens: torch.Tensor  # [B] context length after this step
    query_lens: list[int]  # tokens of each sequence in this step
    pad_rows: torch.Tensor  # [T] row of each token in the padded [B * max_query_len] layout
    attn_mask: torch.Tensor  # [B, 1, max_query_len, max_seq_len] bool, True = may attend
    max_query_len: int
    max_seq_len: int
    # pure-decode steps go to this paged kernel when set (see triton_attention.py):
    # (kv_cache, layer, q [B, Hq, D], block_tables, seq_lens, scale) -> [B, Hq, D]
    decode_kernel: Callable | None = None

    @property
    def is_decode(self) -> bool:
        return self.max_query_len == 1

    @classmethod
    def build(
        cls,
        slots: list[int],
        block_tables: list[list[int]],
        starts: list[int],
        ends: list[int],
        block_size: int,
        device,
    ) -> "AttentionMetadata":
        """From plain lists: per sequence its block table and the span [start, end) computed now."""
        query_lens = [e - s for s, e in zip(starts, ends)]
        batch, max_q, max_seq = len(ends), max(query_lens), max(ends)
        max_blocks = -(-max_seq // block_size)
        tables = torch.zeros(batch, max_blocks, dtype=torch.long)
        for b, table in enumerate(block_tables):
            n = min(len(table), max_blocks)
            tables[b, :n] = torch.tensor(table[:n], dtype=torch.long)
        pad_rows = torch.cat([torch.arange(q) + b * max_q for b, q in enumerate(query_lens)])
        seq_lens = torch.tensor(ends, dtype=torch.long)
        start_t = torch.tensor(starts, dtype=torch.long)
        q_pos = start_t[:, None] + torch.arange(max_q)[None, :]  # [B, max_q] absolute positions
        k_pos = torch.arange(max_seq)
        mask = (k_pos[None, None, :] <= q_pos[:, :, None]) & (k_pos[None, None, :] < seq_lens[:, None, None])
        return cls(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            block_tables=tables.to(device),
            seq_lens=seq_lens.to(device),
            query_lens=query_lens,
            pad_rows=pad_rows.to(device),
            attn_mask=mask[:, None].to(device),
            max_query_len=max_q,
            max_seq_len=max_seq,
        )


def paged_attention(
    kv_cache: torch.Tensor,
    layer: int,
    meta: AttentionMetadata,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Store `k`/`v` ([T, Hkv, D]) for `layer`, attend with `q` ([T, Hq, D]); returns [T, Hq, D]."""
    _, _, num_blocks, block_size, hkv, dim = kv_cache.shape
    k_cache = kv_cache[layer, 0].view(num_blocks * block_size, hkv, dim)
    v_cache = kv_cache[layer, 1].view(num_blocks * block_size, hkv, dim)
    k_cache.index_copy_(0, meta.slot_mapping, k.to(k_cache.dtype))
    v_cache.index_copy_(0, meta.slot_mapping, v.to(v_cache.dtype))

    batch, max_q, max_seq = meta.block_tables.shape[0], meta.max_query_len, meta.max_seq_len
    if meta.decode_kernel is not None and max_q == 1 and q.shape[0] == batch:
        return meta.decode_kernel(kv_cache, layer, q, meta.block_tables, meta.seq_lens, scale or dim**-0.5)
    keys = kv_cache[layer, 0][meta.block_tables].reshape(batch, -1, hkv, dim)[:, :max_seq]
    values = kv_cache[layer, 1][meta.block_tables].reshape(batch, -1, hkv, dim)[:, :max_seq]
    # Slots past a sequence's length (its last block's tail, the padding block 0) hold whatever an
    # earlier owner left, NaN or inf included; a masked score has weight 0 but 0 * NaN is NaN, so
    # they are zeroed here (the gather made a copy) and can never reach another request's result.
    stale = torch.arange(max_seq, device=keys.device)[None, :] >= meta.seq_lens[:, None]
    keys.masked_fill_(stale[:, :, None, None], 0)
    values.masked_fill_(stale[:, :, None, None], 0)
    hq = q.shape[1]
    if max_q == 1 and q.shape[0] == batch:
        q_pad = q.view(batch, 1, hq, dim)
    else:
        q_pad = q.new_zeros(batch * max_q, hq, dim)
        q_pad[meta.pad_rows] = q
        q_pad = q_pad.view(batch, max_q, hq, dim)
    out = sdpa(
        q_pad.transpose(1, 2),
        keys.transpose(1, 2).to(q.dtype),
        values.transpose(1, 2).to(q.dtype),
        attn_mask=meta.attn_mask,
        scale=scale,
        enable_gqa=hq != hkv,
    )  # [B, Hq, max_q, D]
    out = out.transpose(1, 2).reshape(batch * max_q, hq, dim)
    if max_q == 1 and q.shape[0] == batch:
        return out
    return out[meta.pad_rows]
