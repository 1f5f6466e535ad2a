"""The AR engine's prefix cache against the cache-off engine and transformers (the rig of
tests/ar_engine_support.py): multi-turn reuse computes only new tokens, taps of cached positions,
eviction, preemption and aborts over shared blocks, metrics, random traffic."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from ar_engine_support import GREEDY, VOCAB, make_engine, models, prompts, reference  # noqa: E402,F401 (fixtures)

# ---- prefix caching -------------------------------------------------------------------------
def _conversation(seed: int, turns: int, system: list[int]) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (5, 3, 6, 4)[:turns]]


def test_prefix_cache_multi_turn_equal_outputs_and_only_new_tokens_computed(models):
    system = list(range(10, 19))  # 9 tokens shared by every conversation
    on, off = make_engine(models, max_model_len=128), make_engine(models, max_model_len=128, enable_prefix_caching=False)
    convo: list[int] = list(system)
    for i, user in enumerate(_conversation(5, 4, system)):
        convo = convo + user
        before = on.stats()
        got = on.generate([convo], GREEDY)[0]
        assert got == off.generate([convo], GREEDY)[0]
        after = on.stats()
        hit = after["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"]
        computed = after["num_computed_tokens"] - before["num_computed_tokens"]
        if i == 0:
            assert hit == 0
        else:  # every full block of the previous turn (its prompt and answer) is reused
            assert hit == min(prev_computed // 4, (len(convo) - 1) // 4) * 4 and hit >= len(convo) - len(user) - 4 - 12
        assert computed == len(convo) - hit + GREEDY.max_tokens - 1  # the new tokens only, then the decodes
        prev_computed = len(convo) + GREEDY.max_tokens - 1  # the newest token is never computed
        convo = convo + got
    s = on.stats()
    assert 0 < s["prefix_cache_hit_rate"] < 1 and s["prefix_cache_queried_tokens"] > s["prefix_cache_hit_tokens"]
    assert s["free_blocks"] == s["total_blocks"] and s["cached_free_blocks"] > 0
    on.scheduler.blocks.check()
    # a shared system prompt across concurrent requests: the later ones hit the first's blocks
    others = [system + u for u in _conversation(9, 4, system)]
    assert on.generate(others, GREEDY) == off.generate(others, GREEDY)
    assert off.stats()["prefix_cache_queried_tokens"] == 0


def test_prefix_cache_never_serves_the_whole_prompt(models, prompts):
    eng = make_engine(models)
    p = prompts[3][:16]  # 4 full blocks
    first = eng.generate([p], GREEDY)
    hits = eng.stats()["prefix_cache_hit_tokens"]
    assert eng.generate([p], GREEDY) == first
    assert eng.stats()["prefix_cache_hit_tokens"] - hits == 12  # the last block is recomputed for its logits


def test_prefix_cache_taps_of_cached_positions_equal_recomputed(models, prompts):
    kw = dict(tap_layers=(0, 2, 3), max_num_batched_tokens=6)
    on, off = make_engine(models, **kw), make_engine(models, enable_prefix_caching=False, **kw)
    base = prompts[3] + prompts[1]  # 28 tokens

    def run(eng, prompt, hidden=True):
        seq = eng.add_request(f"t{eng.num_steps}", prompt, GREEDY, return_hidden=hidden)
        rows = {t: [] for t in kw["tap_layers"]}
        while not seq.is_finished:
            for o in eng.step():
                assert not o.taps or o.tap_start == sum(r.shape[0] for r in rows[0])  # contiguous
                for t, h in o.taps.items():
                    rows[t].append(h)
        return list(seq.output_token_ids), {t: torch.cat(r) if r else None for t, r in rows.items()}, seq

    run(on, base, hidden=False)  # caches blocks without taps: a tapping request must not use them
    _, taps_first, seq = run(on, base + [1, 2])
    assert seq.num_cached_tokens == 0
    out_on, taps_on, seq = run(on, base + [3, 4, 5])  # reuses the tapped blocks
    assert seq.num_cached_tokens == 28
    out_off, taps_off, _ = run(off, base + [3, 4, 5])
    assert out_on == out_off
    for t in kw["tap_layers"]:
        assert taps_on[t].shape[0] == len(base) + 3 + GREEDY.max_tokens - 1  # every position, cached ones too
        torch.testing.assert_close(taps_on[t], taps_off[t], atol=1e-4, rtol=1e-4)
        assert torch.equal(taps_on[t][:28], taps_first[t][:28])  # the rows kept when they were computed
    run(on, base + [6], hidden=False)  # a request without taps reuses tapped blocks too
    on.scheduler.blocks.check()


def test_prefix_cache_eviction_under_memory_pressure_leaks_nothing(models, prompts, reference):
    eng = make_engine(models, num_blocks=16)  # 64 slots: one long sequence's worth
    first = eng.generate([prompts[3]], GREEDY)
    assert first == [reference[3]]
    for p, ref in zip(prompts, reference):  # each alone: cached blocks are evicted to make room
        assert eng.generate([p], GREEDY) == [ref]
        eng.scheduler.blocks.check()
    assert eng.generate(prompts, GREEDY) == reference  # together: preemption over shared and cached blocks
    assert eng.stats()["num_preemptions"] > 0
    hits = eng.stats()["prefix_cache_hit_tokens"]
    assert eng.generate([prompts[3]], GREEDY) == [reference[3]]
    s = eng.stats()
    assert s["free_blocks"] == s["total_blocks"] == 16 and s["running"] == s["waiting"] == 0
    assert s["prefix_cache_hit_tokens"] >= hits
    eng.scheduler.blocks.check()


def test_prefix_cache_preemption_with_shared_blocks(models):
    common = list(range(20, 40))  # 20 tokens = 5 full blocks shared by every request
    g = torch.Generator().manual_seed(4)
    batch = [common + torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (3, 7, 2, 9, 5, 4)]
    off = make_engine(models, enable_prefix_caching=False)
    want = [off.generate([p], GREEDY)[0] for p in batch]
    eng = make_engine(models, num_blocks=24, max_num_batched_tokens=16)
    eng.generate([common + [1]], GREEDY)  # the common prefix is cached
    assert eng.generate(batch, GREEDY) == want
    s = eng.stats()
    assert s["num_preemptions"] > 0 and s["prefix_cache_hit_tokens"] >= 20 * len(batch)
    assert s["free_blocks"] == s["total_blocks"]
    eng.scheduler.blocks.check()


def test_prefix_cache_abort_drops_references(models):
    common = list(range(30, 46))  # 4 blocks
    eng = make_engine(models)
    eng.generate([common + [5]], GREEDY)
    a = eng.add_request("a", common + [1, 2], GREEDY)
    b = eng.add_request("b", common + [3], GREEDY)
    eng.step()
    bm = eng.scheduler.blocks
    shared = a.block_table[:4]
    assert shared == b.block_table[:4] and all(bm._ref[x] == 2 for x in shared)
    assert eng.abort("a")
    assert all(bm._ref[x] == 1 for x in shared)
    while not b.is_finished:
        eng.step()
    assert b.output_token_ids == make_engine(models, enable_prefix_caching=False).generate([common + [3]], GREEDY)[0]
    assert all(bm._ref[x] == 0 for x in shared) and eng.stats()["free_blocks"] == eng.stats()["total_blocks"]
    bm.check()


def test_prefix_cache_stats_reach_metrics(models, prompts):
    pytest.importorskip("prometheus_client")
    from omni.api.metrics import _StageCollector

    eng = make_engine(models)
    eng.generate([prompts[3]] * 2, GREEDY)
    eng.generate([prompts[3]], GREEDY)
    collector = _StageCollector()
    collector.snapshot = {"thinker.0": eng.stats()}
    gauges = {m.name: m.samples[0].value for m in collector.collect()}
    assert gauges["omni_stage_prefix_cache_hit_tokens"] == 16 and gauges["omni_stage_prefix_cache_queried_tokens"] == 3 * 17
    assert 0 < gauges["omni_stage_prefix_cache_hit_rate"] < 1


@pytest.mark.parametrize("taps", [(), (0, 2)])
def test_prefix_cache_random_traffic_keeps_invariants(models, taps):
    """Requests sharing prefixes arrive, finish and get aborted at random in a small cache: every
    finished output equals the cache-off output, and the block invariants hold after each step.
    With taps, every other request returns them: each position's rows exactly once, in order."""
    g = torch.Generator().manual_seed(12)
    stems = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (9, 14, 5)]
    reqs = [stems[i % 3] + torch.randint(0, VOCAB, (int(k),), generator=g).tolist()
            for i, k in enumerate(torch.randint(1, 9, (14,), generator=g))]
    off = make_engine(models, enable_prefix_caching=False)
    want = [off.generate([p], GREEDY)[0] for p in reqs]
    eng = make_engine(models, num_blocks=20, max_num_batched_tokens=12, max_num_seqs=5, tap_layers=taps)
    seqs, pending, rows = {}, list(range(len(reqs))), {}
    for step in range(2000):
        if pending and step % 2 == 0:
            i = pending.pop(0)
            seqs[i] = eng.add_request(f"q{i}", reqs[i], GREEDY, return_hidden=bool(taps) and i % 2 == 0)
        if step % 7 == 3:
            live = [i for i, s in seqs.items() if not s.is_finished and i % 4 == 1]
            if live:
                eng.abort(f"q{live[0]}")
        for o in eng.step():
            if o.taps:
                assert o.tap_start == rows.get(o.rid, 0)
                rows[o.rid] = o.tap_start + o.taps[0].shape[0]
        eng.scheduler.blocks.check()
        if not pending and not eng.has_unfinished():
            break
    done = [i for i, s in seqs.items() if s.finish_reason is not None and s.finish_reason.value != "abort"]
    assert len(done) >= 8
    for i in done:
        assert seqs[i].output_token_ids == want[i], i
        if taps and i % 2 == 0:
            assert rows[f"q{i}"] == seqs[i].num_tokens - 1
    s = eng.stats()
    assert s["prefix_cache_hit_tokens"] > 0 and s["num_preemptions"] > 0 and s["free_blocks"] == 20
