"""Every stream's left context in one tensor per layer, so a batch is gathered and written back
in two launches per layer instead of one concatenation per layer plus one copy per stream and
layer (at 40 streams that was ~2,000 small copies a step), and so a CUDA graph can read and
write the contexts of any set of streams through an index tensor.

Row 0 is scratch: the padding rows of a graph's batch read and write it, no stream owns it.
"""

from __future__ import annotations

import torch


class StreamSlots:
    """`template`: one stream's fresh context per layer key ([1, ...] tensors, the zero padding
    of a full decode). Rows 1..capacity are lent to streams; `grow` doubles them."""

    def __init__(self, template: dict[str, torch.Tensor], capacity: int) -> None:
        self.template = {k: v.detach() for k, v in template.items()}
        self.capacity = 0
        self.tensors: dict[str, torch.Tensor] = {}
        self.free: list[int] = []
        self.generation = 0  # bumped when the tensors are reallocated (graphs holding them go stale)
        self._resize(max(1, capacity))

    def _resize(self, capacity: int) -> None:
        old, old_capacity = self.tensors, self.capacity
        self.tensors = {k: v.new_zeros((capacity + 1, *v.shape[1:])) for k, v in self.template.items()}
        for k, v in old.items():
            self.tensors[k][: old_capacity + 1] = v
        self.free = list(range(capacity, old_capacity, -1)) + self.free
        self.capacity = capacity
        self.generation += 1

    @property
    def in_use(self) -> int:
        return self.capacity - len(self.free)

    def acquire(self, starts: list[dict[str, torch.Tensor] | None]) -> list[int]:
        """Rows for new streams, set to their start: a snapshot's context, or fresh (zeros)."""
        while len(self.free) < len(starts):
            self._resize(self.capacity * 2)
        rows = [self.free.pop() for _ in starts]
        fresh = [r for r, s in zip(rows, starts) if s is None]
        if fresh:
            index = torch.tensor(fresh, device=self.device)
            for v in self.tensors.values():
                v.index_fill_(0, index, 0)
        for r, s in zip(rows, starts):
            if s is not None:
                for k, v in self.tensors.items():
                    v[r: r + 1].copy_(s[k])
        return rows

    def release(self, row: int) -> None:
        if 0 < row <= self.capacity and row not in self.free:
            self.free.append(row)

    def gather(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: v.index_select(0, index) for k, v in self.tensors.items()}

    def scatter(self, index: torch.Tensor, tensors: dict[str, torch.Tensor]) -> None:
        for k, v in self.tensors.items():
            v.index_copy_(0, index, tensors[k])

    def snapshot(self, row: int) -> dict[str, torch.Tensor]:
        """A copy of one row's context ([1, ...] tensors) that later decodes never touch."""
        return {k: v[row: row + 1].clone() for k, v in self.tensors.items()}

    @property
    def device(self) -> torch.device:
        return next(iter(self.tensors.values())).device

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.tensors.values())
