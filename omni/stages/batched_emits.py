"""A step's one-row chunks of many requests on one port, as one batched Emit (omni/kernel/stage.py).

Why: at 64 streams a decode step emits a chunk per stream (the talker's codes, the thinker's hidden
rows to the talker); each is a bus message and a payload write on the producer and a read on the
consumer. Batched, the step sends one message per edge and consumer replica, and the consumer still
feeds every row as its own chunk. Only chunks of one row each with the same keys, dtypes and row
shapes are batched; their other values ride once when every row has the same one, else per row
(`ROW_VALUES`, merged back into each row's chunk on the way in).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omni.kernel.stage import Emit
from omni.transport.arrays import ROW_VALUES, is_array


def _row_layout(data: dict[str, Any]) -> tuple | None:
    """What must match for two chunks to share a batch (None: not a one-row chunk)."""
    layout = []
    for key in sorted(data):
        value = data[key]
        if is_array(value):
            if len(value.shape) == 0 or value.shape[0] != 1:
                return None
            layout.append((key, str(value.dtype), tuple(value.shape[1:]), type(value).__module__.split(".")[0]))
        else:
            layout.append((key,))
    return tuple(layout)


def _concat(values: list[Any]) -> Any:
    if isinstance(values[0], np.ndarray):
        return np.concatenate(values)
    import torch

    return torch.cat(values)


def batch_chunks(emits: list[Emit], port: str) -> list[Emit]:
    """`emits` with the one-row chunks on `port` of the largest group sharing a layout merged into one
    batched Emit, placed where the first of them was (before any later output of those requests)."""
    groups: dict[tuple, list[int]] = {}
    for i, e in enumerate(emits):
        if e.port == port and e.data and e.rows is None and not e.finish and e.error is None:
            layout = _row_layout(e.data)
            if layout is not None:
                groups.setdefault(layout, []).append(i)
    picked = max(groups.values(), key=len, default=[])
    if len(picked) < 2:
        return emits
    rows = [emits[i] for i in picked]
    first = rows[0].data
    data: dict[str, Any] = {}
    per_row: list[dict[str, Any]] = [{} for _ in rows]
    for key, value in first.items():
        if is_array(value):
            data[key] = _concat([e.data[key] for e in rows])
        elif all(e.data[key] == value for e in rows):
            data[key] = value
        else:
            for values, e in zip(per_row, rows):
                values[key] = e.data[key]
    if any(per_row):
        data[ROW_VALUES] = per_row
    batch = Emit("", port, data, rows=[e.rid for e in rows])
    later = set(picked[1:])
    return [batch if i == picked[0] else e for i, e in enumerate(emits) if i not in later]
