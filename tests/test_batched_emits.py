"""A step's one-row chunks on a port go as one batched Emit (omni/stages/batched_emits.py), and every
consumer gets each request's chunk back as it was (omni/transport/arrays.py split_rows / rows_of):
arrays, shared values and the values that differ by row (the thinker's tap_start, token ids)."""

from __future__ import annotations

import numpy as np
import torch

from omni.kernel.stage import Emit
from omni.stages.batched_emits import batch_chunks
from omni.transport.arrays import ROW_VALUES, rows_of, split_rows


def hidden(rid: str, start: int, token: int, rows: int = 1) -> Emit:
    return Emit(rid, "hidden", {"tap_start": start, "token_ids": [token] * rows, "prompt_len": 7,
                                "layer_0": torch.full((rows, 4), float(start)), "layer_2": torch.full((rows, 4), -float(start))})


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor)
                                        else np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray)
                                        else a[k] == b[k] for k in a)


def test_one_row_chunks_batch_and_split_back_as_they_were():
    emits = [hidden("a", 10, 1), Emit("a", "text", {"token_ids": [1]}), hidden("b", 20, 2), Emit("b", finish=True),
             hidden("c", 30, 3)]
    out = batch_chunks(emits, "hidden")
    assert [e.port for e in out] == ["hidden", "text", "out"]  # the batch where the first chunk was
    batch = out[0]
    assert batch.rows == ["a", "b", "c"] and batch.data["layer_0"].shape == (3, 4)
    assert batch.data["prompt_len"] == 7 and "prompt_len" not in batch.data[ROW_VALUES][0]  # shared: once
    got = {rid: part for rid, part, _ in split_rows("", batch.rows, batch.data)}
    for e in (emits[0], emits[2], emits[4]):
        assert same(got[e.rid], e.data)


def test_multi_row_and_odd_chunks_are_left_alone():
    prompt = hidden("p", 0, 5, rows=6)  # a prompt's rows: not one row
    codes = [Emit(r, "codes", {"codes": np.full((1, 4), i, dtype=np.int64)}) for i, r in enumerate("xyz")]
    other = Emit("w", "codes", {"codes": np.zeros((1, 5), dtype=np.int64)})  # another row shape
    out = batch_chunks([prompt, hidden("q", 3, 4), *codes, other], "codes")
    assert out[0] is prompt and out[1].rid == "q" and out[-1] is other
    assert out[2].rows == ["x", "y", "z"] and ROW_VALUES not in out[2].data
    assert batch_chunks([hidden("q", 3, 4)], "hidden")[0].rows is None  # one chunk: nothing to batch


def test_a_subset_of_rows_keeps_its_own_values():
    batch = batch_chunks([hidden(r, s, s) for r, s in (("a", 1), ("b", 2), ("c", 3))], "hidden")[0]
    two = rows_of(batch.data, [0, 2])
    assert [v["tap_start"] for v in two[ROW_VALUES]] == [1, 3] and two["layer_0"].shape == (2, 4)
    one = rows_of(batch.data, [1])  # a request sent alone (e.g. to the client): its values merged back
    assert one["tap_start"] == 2 and one["token_ids"] == [2] and ROW_VALUES not in one
    [(rid, part, last)] = split_rows("b", [], one)
    assert rid == "b" and last and part is one
