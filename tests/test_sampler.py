"""The one batched sampler (omni/stages/ar/sampler.py) against transformers' logits processors,
its draws against the processed softmax, and its reproducibility alone vs batched."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers.generation.logits_process import (  # noqa: E402
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from omni.stages.ar.sampler import (  # noqa: E402
    RowParams,
    Sampler,
    SampleMode,
    SuppressTokens,
    sample_rows,
    uniform_noise,
)
from omni.stages.ar.sequence import SamplingParams, Sequence  # noqa: E402

V = 64


def _seq(rid: str, prompt: list[int], out: list[int], **params) -> Sequence:
    seq = Sequence(rid, prompt, SamplingParams(**params))
    seq.output_token_ids = list(out)
    return seq


def _hf_chain(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """transformers' processors and warpers, in generate's order, for one row."""
    p = seq.params
    ids = torch.tensor([seq.all_token_ids() if p.penalty_includes_prompt else seq.output_token_ids])
    x = logits[None].clone()
    if p.repetition_penalty != 1.0:
        x = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, x)
    if p.temperature > 0 and p.temperature != 1.0:
        x = TemperatureLogitsWarper(p.temperature)(ids, x)
    if p.top_k:
        x = TopKLogitsWarper(p.top_k)(ids, x)
    if p.top_p < 1.0:
        x = TopPLogitsWarper(p.top_p)(ids, x)
    if p.min_p > 0:
        x = MinPLogitsWarper(p.min_p)(ids, x)
    return x[0]


CASES = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.3, top_p=0.6),
    dict(temperature=0.9, top_k=12, top_p=0.8),
    dict(temperature=1.0, min_p=0.05),
    dict(temperature=0.8, repetition_penalty=1.3, top_k=20),
    dict(temperature=1.1, repetition_penalty=1.2, penalty_includes_prompt=False, top_p=0.9, min_p=0.02),
    dict(temperature=2.0, top_k=1),
]


@pytest.mark.parametrize("mode", [SampleMode.FILTER])
def test_processed_distribution_matches_transformers(mode):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(len(CASES), V, generator=gen) * 3
    sampler = Sampler(V, num_slots=len(CASES), device="cpu")
    seqs = []
    for i, case in enumerate(CASES):
        prompt = torch.randint(0, V, (7,), generator=gen).tolist()
        out = torch.randint(0, V, (5,), generator=gen).tolist()
        seqs.append(_seq(f"r{i}", prompt, out, **case))
        sampler.assign(seqs[-1])
    slots = sampler.slots_of(seqs)
    _, warped, _ = sampler.process(logits, slots, mode, seqs)
    for i, seq in enumerate(seqs):
        want = _hf_chain(logits[i], seq)
        assert torch.equal(torch.isfinite(warped[i]), torch.isfinite(want)), CASES[i]
        torch.testing.assert_close(warped[i].softmax(-1), want.softmax(-1), atol=1e-6, rtol=1e-5)


def test_sample_mode_is_filter_without_top_k_or_top_p():
    """SAMPLE mode (no sort) gives the same distribution as FILTER for rows with no filters."""
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(1))
    rows = RowParams.constant(3, "cpu", temperature=0.8, min_p=0.1)
    a = sample_rows(logits, rows, SampleMode.SAMPLE)
    b = sample_rows(logits, rows, SampleMode.FILTER)
    assert torch.equal(a, b)


def test_presence_frequency_bias_and_suppression():
    logits = torch.zeros(1, V)
    logits[0, 3] = 5.0
    sampler = Sampler(V, 2, "cpu")
    seq = _seq("a", [1], [3, 3, 4], temperature=0.0, presence_penalty=0.5, frequency_penalty=1.0,
               logit_bias={7: 2.0, 9: -1.0}, suppress_token_ids=(10,))
    sampler.assign(seq)
    x, _, _ = sampler.process(logits, sampler.slots_of([seq]), SampleMode.FILTER, [seq])
    assert x[0, 3].item() == pytest.approx(5.0 - 0.5 - 2 * 1.0)
    assert x[0, 4].item() == pytest.approx(-0.5 - 1.0)
    assert (x[0, 7].item(), x[0, 9].item()) == (2.0, -1.0)
    assert x[0, 10].item() == -math.inf
    assert sampler.sample(logits, sampler.slots_of([seq]), SampleMode.FILTER, [seq]).tolist() == [3]
    with_rule = Sampler(V, 1, "cpu", processors=[SuppressTokens([3], V, "cpu")])
    plain = _seq("b", [1], [], temperature=0.0)
    with_rule.assign(plain)
    assert with_rule.sample(logits, with_rule.slots_of([plain]), SampleMode.FILTER, [plain]).tolist() != [3]


def test_min_tokens_holds_back_the_stop_ids_only_while_few_tokens_are_out():
    """transformers' MinNewTokensLengthLogitsProcessor: stop ids are -inf for the first min_tokens draws."""
    logits = torch.zeros(2, V)
    logits[:, 5], logits[:, 6], logits[:, 8] = 9.0, 8.0, 7.0  # 5 and 6 are stop ids, 8 the best other token
    sampler = Sampler(V, 2, "cpu")
    held = _seq("a", [1], [], temperature=0.0, min_tokens=2, stop_token_ids=(5, 6))
    free = _seq("b", [1], [], temperature=0.0, stop_token_ids=(5, 6))
    for seq in (held, free):
        sampler.assign(seq)
    slots = sampler.slots_of([held, free])
    drawn = [sampler.sample(logits, slots, SampleMode.SAMPLE).tolist() for _ in range(3)]  # graph-safe: no seqs
    assert drawn == [[8, 5], [8, 5], [5, 5]]
    assert not held.params.neutral


def test_draws_follow_the_processed_softmax():
    """20,000 seeded draws against softmax(processed logits): a chi-square test per row."""
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 24, generator=gen)
    n = 20000
    x = logits.repeat_interleave(n, 0)
    rows = RowParams(torch.tensor([1.0, 0.7]).repeat_interleave(n), torch.tensor([0, 6]).repeat_interleave(n),
                     torch.tensor([1.0, 0.9]).repeat_interleave(n), torch.zeros(2 * n),
                     torch.arange(2 * n) * 7919 + 11, torch.zeros(2 * n, dtype=torch.long))
    draws = sample_rows(x, rows).view(2, n)
    for r in range(2):
        single = RowParams(rows.temperature[r * n : r * n + 1], rows.top_k[r * n : r * n + 1],
                           rows.top_p[r * n : r * n + 1], torch.zeros(1), torch.zeros(1, dtype=torch.long),
                           torch.zeros(1, dtype=torch.long))
        from omni.stages.ar.sampler import warp

        probs = warp(logits[r : r + 1], single, SampleMode.FILTER).softmax(-1)[0]
        counts = torch.bincount(draws[r], minlength=24).double()
        assert counts[probs == 0].sum() == 0  # never outside the kept set
        keep = probs > 0
        expected = probs[keep].double() * n
        chi2 = float(((counts[keep] - expected) ** 2 / expected).sum())
        dof = int(keep.sum()) - 1
        assert chi2 < dof + 6 * math.sqrt(2 * dof), (r, chi2, dof)  # ~4 sigma


def test_noise_is_uniform_and_a_pure_function():
    seed, counter = torch.tensor([1, 1, 2]), torch.tensor([0, 1, 0])
    u = uniform_noise(seed, counter, torch.arange(4096))
    assert float(u.min()) > 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    again = uniform_noise(seed[:1], counter[:1], torch.arange(4096))
    assert torch.equal(again[0], u[0])


def test_seeded_rows_alone_or_batched_greedy_beside_them():
    gen = torch.Generator().manual_seed(3)
    steps = [torch.randn(4, V, generator=gen) for _ in range(6)]

    def run(row_ids: list[int]) -> dict[int, list[int]]:
        sampler = Sampler(V, 4, "cpu")
        params = [dict(temperature=1.0, top_p=0.9, seed=11), dict(temperature=0.0),
                  dict(temperature=1.2, top_k=8, seed=5, repetition_penalty=1.5), dict(temperature=3.0, seed=2)]
        seqs = {i: _seq(f"s{i}", [1, 2], [], **params[i]) for i in row_ids}
        for s in seqs.values():
            sampler.assign(s)
        out = {i: [] for i in row_ids}
        for logits in steps:
            batch = [seqs[i] for i in row_ids]
            toks = sampler.sample(logits[row_ids], sampler.slots_of(batch), SampleMode.FILTER, batch).tolist()
            for i, t in zip(row_ids, toks):
                out[i].append(t)
                seqs[i].output_token_ids.append(t)
        return out

    together = run([0, 1, 2, 3])
    for i in range(4):
        assert run([i])[i] == together[i]
    assert run([2, 0])[0] == together[0]
    assert together[1] == [int(s[1].argmax()) for s in steps]  # greedy stays greedy beside sampled rows


def test_slot_rebuilt_after_release_gives_the_same_stream():
    """A preempted sequence gets its slot rebuilt from its host state: same draws as never leaving."""
    gen = torch.Generator().manual_seed(4)
    steps = [torch.randn(1, V, generator=gen) for _ in range(5)]
    sampler = Sampler(V, 2, "cpu")
    a = _seq("a", [1], [], temperature=1.0, seed=9, repetition_penalty=1.4)
    b = _seq("b", [1], [], temperature=1.0, seed=9, repetition_penalty=1.4)
    sampler.assign(a)
    got_a = []
    for logits in steps:
        got_a.append(int(sampler.sample(logits, sampler.slots_of([a]), SampleMode.FILTER)[0]))
        a.output_token_ids.append(got_a[-1])
    got_b = []
    for logits in steps:
        sampler.assign(b)
        got_b.append(int(sampler.sample(logits, sampler.slots_of([b]), SampleMode.FILTER)[0]))
        b.output_token_ids.append(got_b[-1])
        sampler.release(b)
    assert got_a == got_b


def test_nonfinite_rows_give_minus_one_and_spare_the_others():
    logits = torch.randn(3, V)
    logits[1, 5] = float("nan")
    sampler = Sampler(V, 3, "cpu")
    seqs = [_seq(f"n{i}", [1], [], temperature=t) for i, t in enumerate((0.0, 1.0, 0.0))]
    for s in seqs:
        sampler.assign(s)
    out = sampler.sample(logits, sampler.slots_of(seqs), SampleMode.FILTER, seqs).tolist()
    assert out[1] == -1 and out[0] == int(logits[0].argmax()) and out[2] == int(logits[2].argmax())


def test_bad_sampling_params_are_refused():
    from omni.kernel.errors import InvalidRequest

    for bad in (dict(min_p=1.5), dict(temperature=float("nan")), dict(logit_bias={"x": 1}),
                dict(logit_bias={3: float("inf")}), dict(presence_penalty=float("inf"))):
        with pytest.raises(InvalidRequest):
            SamplingParams(**bad)


def test_modes_the_engine_picks_and_greedy_mode_agrees():
    big = Sampler(40000, 3, "cpu")
    small = Sampler(V, 3, "cpu")
    greedy = [_seq("g", [1], [], temperature=0.0, repetition_penalty=1.3)]
    plain = greedy + [_seq("p", [1], [], temperature=1.0)]
    filtered = plain + [_seq("f", [1], [], temperature=1.0, top_p=0.9)]
    assert [big.mode_for(s) for s in (greedy, plain, filtered)] == [SampleMode.GREEDY, SampleMode.SAMPLE,
                                                                     SampleMode.FILTER]
    # graph keys take only the modes captured at start-up
    assert [big.mode_for(s, graph=True) for s in (greedy, plain, filtered)] == [SampleMode.SAMPLE, SampleMode.SAMPLE,
                                                                                SampleMode.FILTER]
    assert {small.mode_for(s, graph=True) for s in (greedy, plain, filtered)} == {SampleMode.FILTER}
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(5))
    outs = set()
    for mode in SampleMode:  # a fresh slot each time: `sample` counts its draw into the slot
        sampler = Sampler(V, 1, "cpu")
        seq = _seq("a", [1, 2, 3], [4, 4], temperature=0.0, repetition_penalty=1.3)
        sampler.assign(seq)
        outs.add(tuple(sampler.sample(logits, sampler.slots_of([seq]), mode, [seq]).tolist()))
    assert len(outs) == 1


def test_engine_params_are_the_typed_sampling_plus_engine_fields():
    """The fields are written once: SamplingParams is a Sampling (the bus's) with the engine-only
    fields added; what a request leaves None is the engine's default; the engine's domain is its
    own (wider than a client's OpenAI ranges: temperature 3 runs) and checked in one place."""
    from omni.kernel.errors import InvalidRequest
    from omni.sampling import Sampling
    from omni.stages.ar.sequence import ENGINE_DEFAULTS, ENGINE_DOMAIN

    assert issubclass(SamplingParams, Sampling)
    engine_only = set(SamplingParams.__struct_fields__) - set(Sampling.__struct_fields__)
    assert engine_only == {"penalty_includes_prompt", "stop_token_ids", "suppress_token_ids", "min_tokens"}
    assert set(ENGINE_DEFAULTS) | set(ENGINE_DOMAIN) <= set(SamplingParams.__struct_fields__)
    p = SamplingParams()
    assert all(getattr(p, name) == value for name, value in ENGINE_DEFAULTS.items())
    assert p.seed is None and p.logprobs is None and p.greedy is False and p.neutral
    assert SamplingParams(temperature=3.0).temperature == 3.0
    assert SamplingParams(top_k=-1).top_k == 0  # the API's "off" (Sampling's TopK) is the engine's 0
    for bad in (dict(top_k=-2), dict(max_tokens=0), dict(min_tokens=-1), dict(logprobs=21), dict(top_p=0.0)):
        with pytest.raises(InvalidRequest, match=next(iter(bad))):
            SamplingParams(**bad)
