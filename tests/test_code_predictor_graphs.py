"""The code predictor's static (CUDA-graph) path against its eager `predict`.

On CPU the static path (preallocated caches, unrolled loop, the sampler and embedding lookup
inside, batch padded to a bucket) runs eagerly: it must give exactly the eager codes and
embeddings for every batch size, padding rows included, greedy and sampled rows alike for the
same seeds. Marked `gpu`: the captured graphs against the eager path on CUDA.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.modules.talker import TalkerModel
from omni.stages.codec_lm.code_predictor import greedy_codes, sampled_codes
from omni.stages.codec_lm.code_predictor_graphs import CodePredictorGraphs
from omni.stages.codec_lm.request import STATE_KEY, CodecLMRequest

pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=["tiny-b", "tiny-c"])
def ckpt(request, tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp(request.param), seed=4, preset=request.param)


@pytest.fixture(scope="module")
def talker(ckpt):
    return TalkerModel.from_checkpoint(ckpt)


def _inputs(talker: TalkerModel, batch: int, seed: int, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, talker.text_cfg.hidden_size, generator=gen)
    code0 = torch.randint(0, talker.cfg.code2wav.codebook_size, (batch,), generator=gen)
    with torch.no_grad():
        embed = talker.model.codec_embedding(code0.to(device))
    return hidden.to(device, embed.dtype), embed


def _eager(talker: TalkerModel, hidden, embed):
    return talker.code_predictor.predict(hidden, embed, greedy_codes)


def _assert_same(got, want) -> None:
    assert got[0].shape == want[0].shape and torch.equal(got[0], want[0])
    assert got[1].shape == want[1].shape and torch.equal(got[1], want[1])


def test_static_path_equals_eager_for_every_bucket(talker):
    graphs = CodePredictorGraphs(talker.code_predictor, max_batch=8, device="cpu")
    assert graphs.sizes == [1, 2, 4, 8] and not graphs.capture
    for seed, batch in enumerate([1, 3, 8, 2, 5, 4, 3]):  # 3 after 4 and 5: stale rows are cleared
        hidden, embed = _inputs(talker, batch, seed)
        want = _eager(talker, hidden, embed)
        got = graphs.run(hidden, embed)
        _assert_same(got, want)
        assert len(set(got[0].flatten().tolist())) > 1  # not a degenerate predictor
    assert sorted(graphs.statics) == [1, 2, 4, 8] and graphs.num_runs == 7


def test_padding_rows_do_not_change_real_rows(talker):
    graphs = CodePredictorGraphs(talker.code_predictor, max_batch=8, device="cpu")
    hidden, embed = _inputs(talker, 5, seed=11)
    together = graphs.run(hidden, embed)
    for row in range(5):
        alone = graphs.run(hidden[row:row + 1], embed[row:row + 1])
        assert torch.equal(alone[0][0], together[0][row]) and torch.equal(alone[1][0], together[1][row])


def test_outputs_survive_the_next_run(talker):
    graphs = CodePredictorGraphs(talker.code_predictor, max_batch=4, device="cpu")
    first = graphs.run(*_inputs(talker, 2, seed=1))
    kept = (first[0].clone(), first[1].clone())
    graphs.run(*_inputs(talker, 2, seed=2))
    _assert_same(first, kept)


def test_batches_past_max_batch_are_refused(talker):
    graphs = CodePredictorGraphs(talker.code_predictor, max_batch=2, device="cpu")
    assert graphs.run(*_inputs(talker, 3, seed=0)) is None and not graphs.statics
    graphs.disabled = "capture failed"
    assert graphs.run(*_inputs(talker, 1, seed=0)) is None
    with pytest.raises(ValueError):
        CodePredictorGraphs(talker.code_predictor, max_batch=0, device="cpu")


def _seqs(greedy: list[bool], seed: int):
    seqs = []
    for i, g in enumerate(greedy):
        req = CodecLMRequest(inputs=None, greedy=g, seed=seed + i)
        params = SimpleNamespace(stop_token_ids=(), max_tokens=100)
        seqs.append(SimpleNamespace(model_state={STATE_KEY: req}, params=params, output_token_ids=[], num_tokens=5))
    return seqs


def _after_sample(talker: TalkerModel, greedy: list[bool], seed: int):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(len(greedy), talker.text_cfg.hidden_size, generator=gen)
    tokens = torch.randint(0, talker.cfg.code2wav.codebook_size, (len(greedy),), generator=gen)
    seqs = _seqs(greedy, seed)
    extras = talker.after_sample(seqs, tokens, hidden).resolve().extras
    frames = [s.model_state[STATE_KEY].frame_embeds[0] for s in seqs]
    return [e["codes"] for e in extras], frames


@pytest.mark.parametrize("greedy", [[True] * 3, [True, False, True], [False, False]])
def test_talker_graphs_equal_eager_for_greedy_and_sampled_rows(talker, greedy):
    talker.predictor_graphs = None
    want = _after_sample(talker, greedy, seed=5)
    talker.use_predictor_graphs(max_batch=4)
    try:
        got = _after_sample(talker, greedy, seed=5)
        assert talker.predictor_graphs.num_runs == 1  # sampled rows run in the graph too
    finally:
        talker.predictor_graphs = None
    for a, b in zip(got[0] + got[1], want[0] + want[1]):
        assert torch.equal(a, b)


def _sampled(talker, hidden, embed, seeds, frames, temperature=1.0):
    n = hidden.shape[0]
    t = torch.full((n,), temperature)
    return t, torch.tensor(seeds), torch.tensor(frames)


def test_static_sampled_path_equals_the_eager_loop(talker):
    """Same seeds and frames: the unrolled static path (run eagerly here) draws what `predict` draws,
    alone or batched, and a different seed or frame draws differently."""
    graphs = CodePredictorGraphs(talker.code_predictor, max_batch=8, device="cpu")
    hidden, embed = _inputs(talker, 5, seed=3)
    t, seed, frame = _sampled(talker, hidden, embed, [7, 8, 9, 10, 11], [0, 1, 2, 0, 5])
    t[1] = 0.0  # a greedy row among sampled ones
    groups = talker.code_predictor.num_code_groups
    want = talker.code_predictor.predict(hidden, embed, sampled_codes(t, seed, frame, groups))
    _assert_same(graphs.run(hidden, embed, t, seed, frame), want)
    for row in (0, 4):
        alone = graphs.run(hidden[row:row + 1], embed[row:row + 1], t[row:row + 1], seed[row:row + 1], frame[row:row + 1])
        assert torch.equal(alone[0][0], want[0][row])
    greedy = _eager(talker, hidden[1:2], embed[1:2])
    assert torch.equal(want[0][1], greedy[0][0])
    other = graphs.run(hidden, embed, t, seed + 100, frame)
    assert not torch.equal(other[0][[0, 2, 3, 4]], want[0][[0, 2, 3, 4]])


# ---- on the GPU ----------------------------------------------------------------------------

@pytest.mark.gpu
def test_graphs_equal_eager_on_cuda(ckpt, exact_cuda):
    talker = TalkerModel.from_checkpoint(ckpt, device="cuda")
    graphs = CodePredictorGraphs(talker.code_predictor, max_batch=16, device="cuda")
    for seed, batch in enumerate([1, 3, 16, 3]):
        hidden, embed = _inputs(talker, batch, seed, device="cuda")
        want = _eager(talker, hidden, embed)
        got = graphs.run(hidden, embed)
        assert graphs.disabled is None, graphs.disabled
        _assert_same(got, want)
    assert graphs.stats()["code_predictor_graphs"] == 3  # buckets 1, 4, 16
    hidden, embed = _inputs(talker, 5, seed=9, device="cuda")
    t, seed, frame = (x.cuda() for x in _sampled(talker, hidden, embed, [1, 2, 3, 4, 5], [0, 3, 1, 1, 9]))
    want = talker.code_predictor.predict(hidden, embed, sampled_codes(t, seed, frame, talker.code_predictor.num_code_groups))
    _assert_same(graphs.run(hidden, embed, t, seed, frame), want)  # sampled graph == sampled eager
