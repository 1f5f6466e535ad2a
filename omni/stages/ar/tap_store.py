"""Hidden-state tap rows kept per KV slot, so that prefix-cached positions still have taps.

A downstream stage (the talker) needs the taps of every prompt position, cached ones included.
With prefix caching and `tap_layers`, every step writes the tap rows of the sequences that return
hidden states at their tokens' cache slots here (one `[num_slots, H]` buffer per tap, allocated on
first use); a later sequence that reuses a tapped block (block_manager.py) reads its rows back
instead of recomputing them. Rows live and die with their block: they are only read through a
block table that holds the block.
"""

from __future__ import annotations

import torch

from omni.stages.ar.model_api import SeqSpan


class TapStore:
    def __init__(self, num_slots: int, block_size: int, device) -> None:
        self.num_slots = num_slots
        self.block_size = block_size
        self.device = torch.device(device)
        self.rows: dict[int, torch.Tensor] = {}

    def _slots(self, table: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    @torch.no_grad()  # the buffers outlive every step: they must never join an autograd graph
    def write(self, spans: list[SeqSpan], taps: dict[int, torch.Tensor]) -> None:
        """Keep the rows of `spans` (rows [row, row + n) of each tap) at their positions' slots."""
        slots: list[int] = []
        rows: list[int] = []
        for span in spans:
            slots += self._slots(span.seq.block_table, span.start, span.end)
            rows += range(span.row, span.row + span.num_tokens)
        if not slots:
            return
        dev = next(iter(taps.values())).device
        slot_t = torch.tensor(slots, dtype=torch.long).to(dev, non_blocking=True)
        row_t = torch.tensor(rows, dtype=torch.long).to(dev, non_blocking=True)
        for t, x in taps.items():
            buf = self.rows.get(t)
            if buf is None:
                buf = self.rows[t] = torch.zeros(self.num_slots, x.shape[-1], dtype=x.dtype, device=dev)
            buf.index_copy_(0, slot_t, x.index_select(0, row_t).to(buf.dtype))

    @torch.no_grad()
    def read(self, table: list[int], start: int, end: int, taps: tuple[int, ...]) -> dict[int, torch.Tensor]:
        """Rows of positions [start, end) of the sequence whose block table is `table`."""
        any_buf = next(iter(self.rows.values()))
        idx = torch.tensor(self._slots(table, start, end), dtype=torch.long).to(any_buf.device, non_blocking=True)
        return {t: self.rows[t].index_select(0, idx) for t in taps}
