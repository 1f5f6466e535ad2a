"""Array <-> bytes views shared by the CPU channels; torch is imported only if a tensor shows up."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

_TORCH_ONLY = {"bfloat16"}


def as_numpy(array: Any) -> tuple[np.ndarray, str]:
    """A C-contiguous numpy view of `array` (copying only if it is not contiguous) and its dtype name."""
    if type(array).__module__.startswith("torch"):
        tensor = array.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        tensor = tensor.contiguous()
        name = str(tensor.dtype).removeprefix("torch.")
        if name in _TORCH_ONLY:
            import torch

            return tensor.view(torch.int16).numpy(), name
        return tensor.numpy(), name
    arr = np.ascontiguousarray(array)
    return arr, arr.dtype.name


def from_buffer(buffer: Any, dtype: str, shape: list[int]) -> Any:
    """View `buffer` as an array of `dtype` and `shape`; torch-only dtypes come back as tensors."""
    if dtype in _TORCH_ONLY:
        import torch

        raw = np.frombuffer(buffer, dtype=np.int16).reshape(shape)
        return torch.from_numpy(raw).view(getattr(torch, dtype))
    return np.frombuffer(buffer, dtype=np.dtype(dtype)).reshape(shape)


def torch_loaded() -> bool:
    return "torch" in sys.modules


def is_array(value: Any) -> bool:
    """True for numpy arrays and tensors (anything with an array interface), without torch."""
    return (hasattr(value, "__array_interface__") or hasattr(value, "__cuda_array_interface__")
            or type(value).__module__.startswith("torch"))


ROW_VALUES = "row_values"  # a batched chunk's non-array values that differ by row: a list, a dict per row


def rows_of(data: dict[str, Any], rows: list[int] | slice) -> dict[str, Any]:
    """Those rows of a batched chunk's arrays and per-row values (its other values as they are); the
    values of a single row are merged into its chunk, as it was before batching."""
    out = {k: v[rows] if is_array(v) else v for k, v in data.items() if k != ROW_VALUES}
    per_row = data.get(ROW_VALUES)
    if per_row is not None:
        picked = per_row[rows] if isinstance(rows, slice) else [per_row[i] for i in rows]
        if len(picked) == 1:
            out.update(picked[0])
        else:
            out[ROW_VALUES] = picked
    return out


def split_rows(rid: str, rows: list[str], data: dict[str, Any]):
    """(rid, chunk, is_last) for each row of a batched chunk (`rows`: its requests), or the one chunk
    of `rid` when `rows` is empty."""
    if not rows:
        yield rid, rows_of(data, slice(0, 1)) if ROW_VALUES in data else data, True
    for i, row in enumerate(rows):
        yield row, rows_of(data, slice(i, i + 1)), i + 1 == len(rows)
