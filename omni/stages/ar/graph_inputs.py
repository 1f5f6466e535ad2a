"""A decode graph's fixed-shape inputs, written on the host and sent to the device in one copy.

Per step a decode graph needs token ids, cache slots, context lengths, rope positions ([B] or
[P, B]), the rows' sampler slots and block tables ([B, ctx_blocks]). Written one by one they cost a handful of small
kernels and blocking H2D copies per step; here they live side by side in one byte buffer on the
device (the graph reads views of it) mirrored by one pinned host buffer that plain Python writes
through numpy views. A step then costs one non-blocking copy of the small header (ids, slots,
lengths, positions) and, only when a block table changed, one copy of the changed rows. Block
tables are kept incrementally: a row remembers which table (list object) it holds and how many
blocks of it were written, so a decode step usually writes no table entry at all (the block
manager only ever appends to a table, or replaces it by a new list when it frees it).

Padding rows (batch rows past the real ones) read and write only the scratch block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omni.stages.ar.model_api import SeqSpan

_ALIGN = 16
_STALE = object()  # a row owner that matches no table: the row is rewritten on the next write


@dataclass
class GraphDecodeStep:
    """A decode step whose inputs already sit in a graph's static buffers (see `DecodeGraphs`)."""

    spans: list[SeqSpan]
    static: Any  # cuda_graphs._Static
    num_tokens: int


def decode_rows(model, scheduled: list, block_size: int) -> tuple[list, ...]:
    """Per row of a one-token-per-sequence step: span, token id, cache slot, context length and
    block table; then the rows' rope positions (one tensor, [n] or [P, n]) and input embeddings (one
    [n, H] tensor, None where every row embeds its id, or a per-row list when only some do):
    from the model's batched `decode_inputs` when it gives them, else row by row."""
    spans, ids, slots, lens, tables = [], [], [], [], []
    bs = block_size
    for row, item in enumerate(scheduled):
        seq = item.seq
        p = seq.num_computed_tokens
        prompt, table = seq.prompt_token_ids, seq.block_table
        spans.append(SeqSpan(seq, p, p + 1, row))
        ids.append(prompt[p] if p < len(prompt) else seq.output_token_ids[p - len(prompt)])
        slots.append(table[p // bs] * bs + p % bs)
        lens.append(p + 1)
        tables.append(table)
    batched = model.decode_inputs([s.seq for s in spans], [n - 1 for n in lens])
    if batched is not None:
        positions, embeds = batched
    else:
        rows = [model.positions(s.seq, s.start, s.end) for s in spans]
        positions = torch.cat(rows, dim=-1) if len(rows) > 1 else rows[0]
        embeds = [model.input_embeds(s.seq, s.start, s.end) for s in spans]
        if all(e is None for e in embeds):
            embeds = None
        elif all(e is not None for e in embeds):
            embeds = torch.cat(embeds) if len(embeds) > 1 else embeds[0]
    return spans, ids, slots, lens, positions, embeds, tables


def numpy_dtype(dtype: torch.dtype):
    """The numpy dtype of a torch dtype, or None (e.g. bfloat16) when numpy has none."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:
        return None


class StagedInputs:
    """One graph key's inputs: device views into one byte buffer and numpy views of its host mirror."""

    def __init__(self, size: int, ctx_blocks: int, pos_lead: tuple[int, ...], pos_dtype: torch.dtype,
                 scratch_block: int, block_size: int, device: torch.device, sample_scratch: int = 0) -> None:
        self.size, self.ctx_blocks, self.scratch_block = size, ctx_blocks, scratch_block
        self.scratch_slot = scratch_block * block_size
        self.sample_scratch = sample_scratch
        layout = [("input_ids", (size,), torch.long), ("slot_mapping", (size,), torch.long),
                  ("seq_lens", (size,), torch.long), ("sample_slots", (size,), torch.long),
                  ("positions", (*pos_lead, size), pos_dtype),
                  ("block_tables", (size, ctx_blocks), torch.long)]
        offsets, total = [], 0
        for _, shape, dtype in layout:
            offsets.append(total)
            nbytes = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
            total += -(-nbytes // _ALIGN) * _ALIGN
        self.header_bytes = offsets[-1]
        self.row_bytes = ctx_blocks * 8
        self.cuda = device.type == "cuda"
        self.host = torch.zeros(total, dtype=torch.uint8, pin_memory=self.cuda)
        self.device_buf = torch.zeros(total, dtype=torch.uint8, device=device)
        self.dev: dict[str, torch.Tensor] = {}
        self.np: dict[str, np.ndarray] = {}
        host = self.host.numpy()
        for (name, shape, dtype), off in zip(layout, offsets):
            nbytes = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
            self.dev[name] = self.device_buf[off : off + nbytes].view(dtype).view(shape)
            raw = np.dtype(f"u{torch.empty(0, dtype=dtype).element_size()}")  # bits of e.g. bfloat16
            self.np[name] = host[off : off + nbytes].view(numpy_dtype(dtype) or raw).reshape(shape)
        self.np["slot_mapping"][:] = self.scratch_slot
        self.np["seq_lens"][:] = 1
        self.np["sample_slots"][:] = sample_scratch
        self.np["block_tables"][:] = scratch_block
        self.owner: list[Any] = [None] * size  # the block-table list each row holds (None: scratch)
        self.written = [0] * size
        self.event = torch.cuda.Event() if self.cuda else None
        self.device_buf.copy_(self.host)

    def invalidate(self) -> None:
        """The device buffers were written behind the mirror's back: rewrite everything next time."""
        self.owner = [_STALE] * self.size
        self.written = [0] * self.size

    def write(self, ids: list[int], slots: list[int], lens: list[int], positions: np.ndarray,
              tables: list[list[int]], sample_slots: list[int]) -> None:
        """Write one step's n rows (padding after them) on the host, then send what changed."""
        if self.event is not None:
            self.event.synchronize()  # the previous step's copy has left the host buffer
        n, size, a = len(ids), self.size, self.np
        a["input_ids"][:n] = ids
        a["slot_mapping"][:n] = slots
        a["seq_lens"][:n] = lens
        a["sample_slots"][:n] = sample_slots
        a["positions"][..., :n] = positions
        if n < size:
            a["input_ids"][n:] = 0
            a["slot_mapping"][n:] = self.scratch_slot
            a["seq_lens"][n:] = 1
            a["sample_slots"][n:] = self.sample_scratch
            a["positions"][..., n:] = 0
        lo, hi = self._write_tables(tables)
        dev, host = self.device_buf, self.host
        dev[: self.header_bytes].copy_(host[: self.header_bytes], non_blocking=True)
        if lo < hi:
            start, end = self.header_bytes + lo * self.row_bytes, self.header_bytes + hi * self.row_bytes
            dev[start:end].copy_(host[start:end], non_blocking=True)
        if self.event is not None:
            self.event.record()

    def _write_tables(self, tables: list[list[int]]) -> tuple[int, int]:
        """Bring the host rows up to date; returns the range [lo, hi) of rows that changed."""
        arr, owner, written, ctx = self.np["block_tables"], self.owner, self.written, self.ctx_blocks
        lo, hi = self.size, 0
        for b, table in enumerate(tables):
            k = min(len(table), ctx)
            if owner[b] is table and k >= written[b]:
                if k == written[b]:
                    continue
                arr[b, written[b] : k] = table[written[b] : k]
            else:
                arr[b, :k] = table[:k]
                arr[b, k:] = self.scratch_block
                owner[b] = table
            written[b] = k
            lo, hi = min(lo, b), b + 1
        for b in range(len(tables), self.size):
            if owner[b] is not None:
                arr[b] = self.scratch_block
                owner[b], written[b] = None, 0
                lo, hi = min(lo, b), b + 1
        return lo, hi
