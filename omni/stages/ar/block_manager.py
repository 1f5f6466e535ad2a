"""Paged KV-cache bookkeeping: fixed-size blocks, a free list, one block table per sequence.

No torch here. Token `i` of a sequence lives in slot `block_table[i // block_size] *
block_size + i % block_size` of the cache (see `attention.py` for the tensor layout).
Blocks are exclusively owned (no prefix sharing yet), so freeing is a plain push back.
"""

from __future__ import annotations

from collections import deque

from omni.stages.ar.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks `seq` needs so that its first `num_tokens` tokens have slots."""
        total = -(-num_tokens // self.block_size)
        return max(0, total - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= len(self._free)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow `seq`'s block table to cover `num_tokens` tokens; raises if blocks run out."""
        need = self.blocks_needed(seq, num_tokens)
        if need > len(self._free):
            raise RuntimeError(f"out of KV blocks: need {need}, have {len(self._free)}")
        for _ in range(need):
            seq.block_table.append(self._free.popleft())

    def free(self, seq: Sequence) -> None:
        """Return every block of `seq` at once."""
        # Most recently freed blocks are reused last: it keeps tables of live sequences stable
        # in tests and spreads writes; any order is correct.
        self._free.extend(seq.block_table)
        seq.block_table = []

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size
