"""Paged KV-cache bookkeeping: fixed-size blocks, reference counts, prefix caching.

No torch here. Token `i` of a sequence lives in slot `block_table[i // block_size] *
block_size + i % block_size` of the cache (see `attention.py` for the tensor layout).

Prefix caching (as nano-vllm's block manager): once a full block's keys/values are computed it
gets a content hash chained from its parent's, blake2b(parent hash, its token ids, the model's
key for those positions). The model's key (`ARModel.prefix_key`) covers whatever else decides the
block's KV (multimodal embeddings, rope positions...); None opts that block and every later one
of the sequence out. A sequence being admitted takes the longest run of cached blocks matching its
own hashes (never its last token: something must be computed to sample from) and shares them by
reference count. A block whose count drops to 0 keeps its content in an LRU of cached-free
blocks; allocation takes plain free blocks first, then evicts the least recently freed cached
ones, so cached content only ever holds memory nobody needs. Blocks are immutable once cached
(a sequence only writes past its shared blocks), so no copy-on-write is needed.

Hidden-state taps: with `tapping`, a block computed for a sequence that returns taps has its tap
rows kept beside it (engine.py's `TapStore`) and is marked tapped; a sequence that must return
the taps of a block only reuses tapped ones.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from hashlib import blake2b
from typing import Callable

from omni.stages.ar.sequence import Sequence

KeyFn = Callable[[Sequence, int, int], "bytes | None"]


def _tokens_only(seq: Sequence, start: int, end: int) -> bytes:
    return b""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, caching: bool = False, key_fn: KeyFn | None = None,
                 tapping: bool = False) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.key_fn = key_fn or _tokens_only
        self.tapping = tapping
        self._free: deque[int] = deque(range(num_blocks))  # no cached content
        self._ref = [0] * num_blocks
        self._hash: list[bytes | None] = [None] * num_blocks
        self._tapped = [False] * num_blocks
        self._by_hash: dict[bytes, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # ref 0, cached; least recently freed first
        self.hit_tokens = 0
        self.queried_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: free ones and cached ones nobody holds."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._evictable)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks `seq` needs so that its first `num_tokens` tokens have slots."""
        total = -(-num_tokens // self.block_size)
        return max(0, total - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow `seq`'s block table to cover `num_tokens` tokens; raises if blocks run out."""
        need = self.blocks_needed(seq, num_tokens)
        if need > self.num_free_blocks:
            raise RuntimeError(f"out of KV blocks: need {need}, have {self.num_free_blocks}")
        for _ in range(need):
            if self._free:
                block = self._free.popleft()
            else:  # evict the least recently freed cached block
                block, _ = self._evictable.popitem(last=False)
                self._forget(block)
            self._ref[block] = 1
            seq.block_table.append(block)

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s reference to each of its blocks at once; cached ones stay findable."""
        # Tail first: a sequence's first blocks (a shared system prompt) are evicted last.
        for block in reversed(seq.block_table):
            self._ref[block] -= 1
            if self._ref[block]:
                continue
            h = self._hash[block]
            if h is not None and self._by_hash.get(h) == block:
                self._evictable[block] = None
            else:
                self._forget(block)
                self._free.append(block)
        seq.block_table = []  # a new list: graph_inputs.py tells tables apart by identity
        seq.num_cached_blocks = 0

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    # ---- prefix caching -------------------------------------------------------------
    def match(self, seq: Sequence) -> list[int]:
        """Cached blocks holding `seq`'s leading full blocks (all but its last token at most);
        no side effects besides remembering `seq`'s hashes. Only for a sequence holding no blocks."""
        if not self.caching or seq.block_table:
            return []
        bs = self.block_size
        limit = (seq.num_tokens - 1) // bs
        self._extend_hashes(seq, limit)
        need_taps = self.tapping and seq.return_hidden
        hits: list[int] = []
        for i, h in enumerate(seq.block_hashes[:limit]):
            block = self._by_hash.get(h)
            if block is None or (need_taps and not self._tapped[block] and (i + 1) * bs > seq.num_tapped_tokens):
                break
            hits.append(block)
        return hits

    def can_admit(self, seq: Sequence, hits: list[int], num_tokens: int) -> bool:
        """Room for `seq` to share `hits` and hold slots for its first `num_tokens` tokens."""
        revived = sum(1 for b in hits if self._ref[b] == 0)  # they stop being allocatable
        new = max(0, -(-num_tokens // self.block_size) - len(hits))
        return new + revived <= self.num_free_blocks

    def admit(self, seq: Sequence, hits: list[int]) -> None:
        """`seq` (holding no blocks) shares `hits`: its computation starts after them."""
        for block in hits:
            if self._ref[block] == 0:
                del self._evictable[block]
            self._ref[block] += 1
        seq.block_table = list(hits)
        seq.num_cached_blocks = len(hits)
        seq.num_computed_tokens = len(hits) * self.block_size
        if self.caching:
            self.queried_tokens += seq.num_tokens
            self.hit_tokens += seq.num_computed_tokens
            if not seq.output_token_ids:
                seq.num_cached_tokens = seq.num_computed_tokens

    def cache_computed(self, seq: Sequence) -> None:
        """Put `seq`'s newly computed full blocks in the cache (after the step that computed them)."""
        if not self.caching:
            return
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        if full <= seq.num_cached_blocks:
            return
        self._extend_hashes(seq, full)  # stops where the model opted out: the blocks before still count
        tapped = self.tapping and seq.return_hidden
        end = min(full, len(seq.block_hashes))
        for i in range(seq.num_cached_blocks, end):
            block, h = seq.block_table[i], seq.block_hashes[i]
            self._hash[block], self._tapped[block] = h, tapped
            old = self._by_hash.get(h)
            if old is None or (tapped and not self._tapped[old]):
                self._by_hash[h] = block
                if old is not None and self._ref[old] == 0:  # an untapped copy nobody holds: now unreachable
                    del self._evictable[old]
                    self._forget(old)
                    self._free.append(old)
        seq.num_cached_blocks = max(seq.num_cached_blocks, end)

    def _extend_hashes(self, seq: Sequence, n: int) -> None:
        """Chain hashes for `seq`'s first `n` full blocks (stops where the model opts out)."""
        bs, hashes = self.block_size, seq.block_hashes
        while len(hashes) < n and not seq.uncacheable:
            start = len(hashes) * bs
            key = self.key_fn(seq, start, start + bs)
            if key is None:
                seq.uncacheable = True
                break
            h = blake2b(hashes[-1] if hashes else b"", digest_size=16)
            h.update(array("q", seq.token_ids(start, start + bs)).tobytes())
            h.update(key)
            hashes.append(h.digest())

    def _forget(self, block: int) -> None:
        h = self._hash[block]
        if h is not None and self._by_hash.get(h) == block:
            del self._by_hash[h]
        self._hash[block], self._tapped[block] = None, False

    def check(self) -> None:
        """Invariants (tests): every block is free, cached-free or held, exactly once."""
        held = sum(1 for r in self._ref if r > 0)
        assert held + len(self._free) + len(self._evictable) == self.num_blocks, "a block leaked"
        assert all(self._ref[b] == 0 for b in self._free) and all(self._ref[b] == 0 for b in self._evictable)
        assert all(self._hash[b] is not None for b in self._evictable)
        assert all(self._hash[b] == h for h, b in self._by_hash.items())
