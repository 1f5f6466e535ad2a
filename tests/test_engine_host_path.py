"""The AR engine's decode fast path (graph inputs staged on the host, sent in one copy).

`StagedInputs` must always hold what a from-scratch build would (incremental block tables
included: appended blocks, tables replaced after preemption, rows that change owner, padding
rows, writes behind its back). End to end, the fast path must give the plain engine's tokens,
for models fed by ids, by embeddings, and by a mix (which falls back to the general path).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.modules.thinker import Qwen3OmniThinker
from omni.stages.ar.config import EngineConfig
from omni.stages.ar.engine import AREngine
from omni.stages.ar.graph_inputs import StagedInputs
from omni.stages.ar.sequence import SamplingParams

SCRATCH, BS = 9, 4
PROMPTS = [list(range(60, 67)), list(range(97, 100)), [70 + (i * 7) % 50 for i in range(40)]]


def _expected(tables, size, ctx):
    want = np.full((size, ctx), SCRATCH, dtype=np.int64)
    for b, t in enumerate(tables):
        want[b, : min(len(t), ctx)] = t[:ctx]
    return want


SAMPLE_SCRATCH = 9


def _write(staged, tables, lens):
    n = len(tables)
    ids = [100 + b for b in range(n)]
    slots = [t[(k - 1) // BS] * BS + (k - 1) % BS for t, k in zip(tables, lens)]
    pos = np.arange(n, dtype=np.float32)[None].repeat(3, 0) + 5
    sample_slots = [10 + b for b in range(n)]
    staged.write(ids, slots, lens, pos, tables, sample_slots)
    dev = staged.dev
    if staged.cuda:
        torch.cuda.synchronize()  # the copies are non-blocking
    dev = {k: v.cpu() for k, v in dev.items()}
    assert dev["input_ids"].tolist() == ids + [0] * (staged.size - n)
    assert dev["slot_mapping"].tolist() == slots + [SCRATCH * BS] * (staged.size - n)
    assert dev["seq_lens"].tolist() == lens + [1] * (staged.size - n)
    assert dev["sample_slots"].tolist() == sample_slots + [SAMPLE_SCRATCH] * (staged.size - n)
    assert dev["positions"][:, :n].tolist() == pos.tolist() and not dev["positions"][:, n:].any()
    np.testing.assert_array_equal(dev["block_tables"].numpy(), _expected(tables, staged.size, staged.ctx_blocks))


def _check_staged(device: str):
    staged = StagedInputs(4, 6, (3,), torch.float32, SCRATCH, BS, torch.device(device), SAMPLE_SCRATCH)
    a, b, c = [0, 1], [2], [3, 4, 5]
    _write(staged, [a, b, c], [6, 3, 12])
    a.append(6)  # a block appended: only that row changes
    _write(staged, [a, b, c], [9, 4, 12])
    assert staged.written[:3] == [3, 1, 3]
    b = [7]  # b freed and re-allocated (a new list): the row is rewritten, stale tail cleared
    _write(staged, [a, b, c], [9, 1, 12])
    _write(staged, [c, a], [12, 9])  # rows change owner; the freed rows become padding
    assert staged.owner[2:] == [None, None]
    _write(staged, [b, a], [1, 9])  # a shorter table takes a row: its old tail is cleared
    _write(staged, [c, a, b, [8, 0, 1, 2, 3, 4, 5]], [12, 9, 1, 27])  # longer than ctx: clipped
    staged.dev["block_tables"].fill_(0)  # written behind the mirror (the general _fill path)
    staged.invalidate()
    _write(staged, [a], [9])


def test_staged_inputs_track_tables_incrementally():
    _check_staged("cpu")


@pytest.mark.gpu
def test_staged_inputs_on_cuda_pinned_and_async():
    _check_staged("cuda")


class EmbedsThinker(Qwen3OmniThinker):
    """Feeds every position (or every `every`-th) as embeddings of its own token: same math as ids."""

    every = 1

    def input_embeds(self, seq, start, end):
        if start % self.every:
            return None
        ids = torch.tensor(seq.token_ids(start, end))
        return self.embed_tokens(ids)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(make_tiny(tmp_path_factory.mktemp("tiny-host"), seed=3, preset="tiny-b"))


def _generate(model, num_blocks=48, **cfg):
    config = EngineConfig(block_size=8, num_blocks=num_blocks, max_num_seqs=4, max_model_len=64, **cfg)
    engine = AREngine(model, config)
    params = [SamplingParams(temperature=0.0, max_tokens=12 + 5 * i, ignore_eos=True) for i in range(len(PROMPTS))]
    return engine.generate(PROMPTS, params), engine


def _count_general_fills(engine):
    calls = []
    fill = engine.runner.graphs._fill
    engine.runner.graphs._fill = lambda *a: (calls.append(1), fill(*a))
    return calls


@pytest.mark.parametrize("every", [0, 1, 2])
def test_fast_path_gives_the_plain_engines_tokens(ckpt, every):
    cls = Qwen3OmniThinker if every == 0 else type("E", (EmbedsThinker,), {"every": every})
    model = cls.from_checkpoint(ckpt, dtype=torch.float32)
    want, _ = _generate(model)
    config = EngineConfig(block_size=16, num_blocks=48, max_num_seqs=4, max_model_len=128, cuda_graphs=True)
    engine = AREngine(model, config)
    general = _count_general_fills(engine)
    params = [SamplingParams(temperature=0.0, max_tokens=12 + 5 * i, ignore_eos=True) for i in range(len(PROMPTS))]
    got = engine.generate(PROMPTS, params)
    assert got == want and len(set(want[2])) > 1
    assert engine.stats()["decode_graph_steps"] > 10
    if every == 2:  # rows alternate between ids and embeddings: the general fill merges them
        assert general
    else:
        assert not general


def test_fast_path_survives_preemption(ckpt):
    model = Qwen3OmniThinker.from_checkpoint(ckpt, dtype=torch.float32)
    want, _ = _generate(model)
    got, engine = _generate(model, num_blocks=8, cuda_graphs=True)  # 8 blocks of 8: sequences preempt
    assert engine.scheduler.num_preemptions > 0
    assert got == want and engine.stats()["decode_graph_steps"] > 10
