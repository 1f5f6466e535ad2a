"""A decode step's inputs for the whole batch at once (`ARModel.decode_inputs`) equal the row-by-row
ones (`positions`, `input_embeds`): the talker's frame inputs and the thinker's positions, through
the decode-graph path that uses them (its padded fixed-shape form runs eagerly on CPU)."""

from __future__ import annotations

import numpy as np
import torch

from kernel_helpers import unbatched
from omni.kernel.stage import StageContext
from omni.models.qwen3_tts.checkpoint.make_tiny import write_model
from omni.models.qwen3_tts.modules.talker import TTSTalkerModel
from omni.models.qwen3_tts.stages.preprocess_stage import PreprocessStage
from omni.models.qwen3_tts.stages.talker_stage import TTSTalkerStage

TEXTS = ("hello there, how are you today?", "a second line", "and a third, longer one to speak")


def _frames(model_dir, model, graphs: bool, params: dict) -> dict[str, np.ndarray]:
    pre = PreprocessStage(StageContext("preprocess", args={"model_dir": str(model_dir)}, out_ports=["prompt"]))
    pre.setup()
    talker = TTSTalkerStage(StageContext("talker", args={"model": model, "model_dir": str(model_dir), "num_blocks": 256,
                                                         "block_size": 8, "max_model_len": 512, "cuda_graphs": graphs},
                                         in_ports=["prompt"], out_ports=["codes"]))
    talker.setup()
    for i, text in enumerate(TEXTS):
        rid = f"r{i}"
        p = {"input": text, "voice": "vivian", **params}
        pre.open(rid, p), pre.close_input(rid), talker.open(rid, p)
        for e in pre.step():
            if e.port == "prompt":
                talker.feed(rid, "prompt", e.data)
        talker.close_input(rid)
    frames: dict[str, list] = {f"r{i}": [] for i in range(len(TEXTS))}
    done = set()
    for _ in range(500):
        for e in unbatched(talker.step()):
            assert e.error is None, e.error
            if e.data is not None and "codes" in e.data:
                frames[e.rid].append(e.data["codes"])
            done |= {e.rid} if e.finish else set()
        if len(done) == len(TEXTS):
            break
    assert len(done) == len(TEXTS)
    return {rid: np.concatenate(f) for rid, f in frames.items()}


def test_talker_frames_through_the_batched_inputs_equal_the_row_by_row_path(tmp_path, monkeypatch):
    model_dir = write_model(tmp_path / "tts", "custom_voice", "tiny-a", seed=0)
    model = TTSTalkerModel.from_checkpoint(model_dir)
    params = {"sampling": {"talker": {"temperature": 0.8, "seed": 5, "max_tokens": 12, "ignore_eos": True}}}
    used = []
    batched = type(model).decode_inputs

    def counting(self, seqs, starts):
        out = batched(self, seqs, starts)
        used.append(out is not None and len(seqs))
        return out

    monkeypatch.setattr(type(model), "decode_inputs", counting)
    got = _frames(model_dir, model, True, params)  # the decode-graph path: batched inputs
    assert max(used) == len(TEXTS)  # every row at once, on steps where all three decode
    monkeypatch.setattr(type(model), "decode_inputs", lambda self, seqs, starts: None)
    rows = _frames(model_dir, model, True, params)  # the same path, row by row
    eager = _frames(model_dir, model, False, params)  # no graph path at all
    for rid in got:
        assert got[rid].shape == (11, model.num_code_groups)  # the 12th token ends the stream: no frame
        np.testing.assert_array_equal(got[rid], rows[rid])
        np.testing.assert_array_equal(got[rid], eager[rid])


def test_the_thinkers_batched_positions_equal_its_row_by_row_positions():
    from omni.models.qwen3_omni.modules.thinker import Qwen3OmniThinker
    from omni.stages.ar.sequence import SamplingParams, Sequence

    seqs = [Sequence(f"s{i}", [1, 2, 3, 4], SamplingParams()) for i in range(3)]
    seqs[1].model_state["mrope"], seqs[1].model_state["mrope_delta"] = torch.zeros(3, 4), -2
    seqs[2].model_state["mrope"], seqs[2].model_state["mrope_delta"] = torch.zeros(3, 4), torch.tensor(7)
    starts = [4, 9, 130]
    thinker = object.__new__(Qwen3OmniThinker)  # the hooks read only the sequences
    pos, emb = thinker.decode_inputs(seqs, starts)
    want = torch.cat([thinker.positions(s, p, p + 1) for s, p in zip(seqs, starts)], dim=1)
    assert emb is None and pos.dtype == want.dtype and torch.equal(pos, want)
    assert thinker.decode_inputs(seqs, [3, 9, 130]) is None  # a prompt row: row by row
    embeds_own_rows = object.__new__(type("T", (Qwen3OmniThinker,), {"input_embeds": lambda self, s, a, b: None}))
    assert embeds_own_rows.decode_inputs(seqs, starts) is None  # a subclass's row hook is asked row by row
