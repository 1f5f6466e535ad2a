"""The code predictor's static (CUDA-graph) path against its eager `predict`.

On CPU the static path (preallocated caches, unrolled loop, argmax and embedding lookup inside,
batch padded to a bucket) runs eagerly: it must give exactly the eager greedy codes and
embeddings for every batch size, padding rows included, and the talker must use it only for
all-greedy batches. Marked `gpu`: the captured graphs against the eager path on CUDA.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from omni.models.qwen3_omni.code_predictor import greedy_codes, sample_codes
from omni.models.qwen3_omni.code_predictor_graphs import CodePredictorGraphs
from omni.models.qwen3_omni.make_tiny import make_tiny
from omni.models.qwen3_omni.talker import TalkerModel, TalkerRequest

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
        gen = None if g else torch.Generator().manual_seed(seed + i)
        req = TalkerRequest(inputs=None, greedy=g, generator=gen)
        params = SimpleNamespace(stop_token_ids=(), max_tokens=100)
        seqs.append(SimpleNamespace(model_state={"talker": req}, params=params, output_token_ids=[], num_tokens=5))
    return seqs


def _after_sample(talker: TalkerModel, greedy: list[bool], seed: int):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(len(greedy), talker.text_cfg.hidden_size, generator=gen)
    tokens = torch.randint(0, talker.cfg.code2wav.codebook_size, (len(greedy),), generator=gen).tolist()
    seqs = _seqs(greedy, seed)
    extras = talker.after_sample(seqs, tokens, hidden)
    frames = [s.model_state["talker"].frame_embeds[0] for s in seqs]
    return [e["codes"] for e in extras], frames


@pytest.mark.parametrize("greedy", [[True] * 3, [True, False, True], [False, False]])
def test_talker_uses_graphs_for_greedy_batches_only(talker, greedy):
    talker.predictor_graphs = None
    want = _after_sample(talker, greedy, seed=5)
    talker.use_predictor_graphs(max_batch=4)
    try:
        got = _after_sample(talker, greedy, seed=5)
        assert talker.predictor_graphs.num_runs == int(all(greedy))
    finally:
        talker.predictor_graphs = None
    for a, b in zip(got[0] + got[1], want[0] + want[1]):
        assert torch.equal(a, b)


def test_sampled_rows_keep_the_seeded_draws(talker):
    """The eager sampler still draws per row from each request's generator."""
    hidden, embed = _inputs(talker, 2, seed=3)

    def draw(seed):
        gens = [torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)]
        return talker.code_predictor.predict(hidden, embed, lambda l, g: sample_codes(l, gens, [False, False]))[0]

    assert torch.equal(draw(7), draw(7))


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
