"""Slot bookkeeping for producer-owned arenas (shm and cuda_ipc): pure Python, no memory touched.

A first-fit free list with coalescing. Slots start on `align`-byte boundaries and their sizes are
rounded up to it, so free blocks always stay aligned. Each allocation gets a fresh token (a
serial number, never reused), so a stale credit naming a slot that was already freed, e.g. one
that arrives after `reset()`, is recognised and ignored instead of freeing somebody else's slot.
"""

from __future__ import annotations

import bisect
import threading

from omni.kernel.errors import PayloadTooLarge

ALIGN = 64


class SlotAllocator:
    """Hands out aligned, non-overlapping [offset, offset + size) ranges of `capacity` bytes."""

    def __init__(self, capacity: int, align: int = ALIGN) -> None:
        if align <= 0 or align & (align - 1):
            raise ValueError(f"align must be a power of two, got {align}")
        if capacity < align:
            raise ValueError(f"capacity {capacity} is smaller than one {align}-byte slot")
        self.align = align
        self.capacity = capacity - capacity % align
        self._lock = threading.Lock()
        self._next_token = 1
        self.reset()

    def reset(self) -> None:
        """Forget every slot: the whole arena is free again (tokens are not reused)."""
        with self._lock:
            self._free_starts: list[int] = [0]
            self._free_sizes: list[int] = [self.capacity]
            self._slots: dict[int, tuple[int, int]] = {}  # token -> (offset, size)
            self.used = 0

    def round_up(self, nbytes: int) -> int:
        return max(self.align, -(-nbytes // self.align) * self.align)

    def alloc(self, nbytes: int) -> tuple[int, int] | None:
        """(token, offset) of a free slot of at least `nbytes`, or None if none is free now.

        Raises PayloadTooLarge (a ValueError) when `nbytes` could never fit, so callers never wait
        for room forever and only the request that sent it fails.
        """
        if nbytes < 0:
            raise ValueError(f"negative size {nbytes}")
        size = self.round_up(nbytes)
        if size > self.capacity:
            raise PayloadTooLarge(f"a payload of {nbytes} bytes exceeds the whole arena ({self.capacity} "
                                  "bytes; raise the stage's arena_bytes to send it)")
        with self._lock:
            for i, free_size in enumerate(self._free_sizes):
                if free_size >= size:
                    offset = self._free_starts[i]
                    if free_size == size:
                        del self._free_starts[i], self._free_sizes[i]
                    else:
                        self._free_starts[i] = offset + size
                        self._free_sizes[i] = free_size - size
                    token = self._next_token
                    self._next_token += 1
                    self._slots[token] = (offset, size)
                    self.used += size
                    return token, offset
        return None

    def free(self, token: int) -> bool:
        """Return the slot named by `token`; False (and nothing changes) if it is not live."""
        with self._lock:
            slot = self._slots.pop(token, None)
            if slot is None:
                return False
            offset, size = slot
            self.used -= size
            starts, sizes = self._free_starts, self._free_sizes
            i = bisect.bisect_left(starts, offset)
            if i > 0 and starts[i - 1] + sizes[i - 1] == offset:  # merge with the block before
                i -= 1
                sizes[i] += size
            else:
                starts.insert(i, offset)
                sizes.insert(i, size)
            if i + 1 < len(starts) and starts[i] + sizes[i] == starts[i + 1]:  # and the one after
                sizes[i] += sizes[i + 1]
                del starts[i + 1], sizes[i + 1]
            return True

    def slot(self, token: int) -> tuple[int, int] | None:
        """(offset, size) of a live slot, or None."""
        return self._slots.get(token)

    @property
    def live(self) -> int:
        return len(self._slots)

    def largest_free(self) -> int:
        return max(self._free_sizes, default=0)

    def free_blocks(self) -> list[tuple[int, int]]:
        """The free list as (offset, size), sorted by offset (for tests and stats)."""
        with self._lock:
            return list(zip(self._free_starts, self._free_sizes))
