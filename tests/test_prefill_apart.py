"""Prefill steps apart from decode steps (`EngineConfig.split_prefill`, on by default with decode
graphs): a step that mixed a new prompt with the running decodes ran eagerly, and at 64 streams
with an arrival a step every talker step was mixed. The scheduler alternates instead: no step
holds both kinds, a decode waits at most one prefill step, a new request at most one decode step.
"""

from __future__ import annotations

from omni.stages.ar.config import EngineConfig
from omni.stages.ar.scheduler import Scheduler
from omni.stages.ar.sequence import SamplingParams, Sequence
from test_fair_overload import run_step as step_once


def seq(rid: str, prompt: int, max_tokens: int = 6) -> Sequence:
    return Sequence(rid, list(range(1, prompt + 1)), SamplingParams(max_tokens=max_tokens))


def run_step(scheduler: Scheduler) -> dict[str, int]:
    """test_fair_overload's step, then the sequences that reached max_tokens finish."""
    got = step_once(scheduler)
    for s in list(scheduler.running):
        if len(s.output_token_ids) >= s.params.max_tokens:
            scheduler.finish(s, None)
    return got


def config(**kw) -> EngineConfig:
    return EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, num_blocks=1024, block_size=4, max_model_len=64,
                        enable_prefix_caching=False, **kw)


def test_on_with_decode_graphs_by_default_and_settable():
    assert config().prefill_apart is False  # CPU: no graphs, mixed steps as before
    assert config(device="cuda").prefill_apart is True
    assert config(device="cuda", split_prefill=False).prefill_apart is False
    assert config(device="cuda", cuda_graphs=False).prefill_apart is False
    assert config(split_prefill=True).prefill_apart is True


def test_no_step_mixes_prefill_and_decode_and_they_alternate():
    scheduler = Scheduler(config(split_prefill=True))
    for i in range(3):
        scheduler.add(seq(f"a{i}", 9))
    kinds, waits, served_at = [], {}, {}
    for step in range(40):
        if step % 2 == 0 and step < 20:  # a new prompt arrives every other step
            scheduler.add(seq(f"n{step}", 5 + step % 7))
            waits[f"n{step}"] = step
        got = run_step(scheduler)
        if not got:
            break
        prefill = any(n > 1 for n in got.values())
        assert not (prefill and any(n == 1 for rid, n in got.items() if rid in served_at)), got
        kinds.append("P" if prefill else "D")
        for rid in got:
            served_at.setdefault(rid, step)
    assert not scheduler.has_unfinished()
    assert "PP" not in "".join(kinds) and "D" in kinds  # decodes never wait two prefill steps
    assert all(served_at[rid] - t <= 1 for rid, t in waits.items())  # a new prompt waits one step at most


def test_off_keeps_mixed_steps():
    scheduler = Scheduler(config())
    scheduler.add(seq("a", 9))
    run_step(scheduler)
    scheduler.add(seq("b", 5))
    assert run_step(scheduler) == {"a": 1, "b": 5}


def test_a_prefill_that_cannot_be_admitted_leaves_the_step_to_the_decodes():
    scheduler = Scheduler(EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, num_blocks=4, block_size=4, max_model_len=16,
                                       enable_prefix_caching=False, split_prefill=True))
    scheduler.add(seq("a", 9))
    run_step(scheduler)  # a holds 3 of the 4 blocks
    scheduler.add(seq("big", 12))  # needs 3 blocks: not now
    assert run_step(scheduler) == {"a": 1}


def test_a_prefill_interval_gathers_arrivals_into_fewer_prefill_steps():
    """prefill_interval=3: an arrival waits at most three decode steps, and the arrivals of those steps
    share one prefill step; decodes still never wait two prefill steps."""
    scheduler = Scheduler(EngineConfig(max_num_seqs=32, max_num_batched_tokens=256, num_blocks=1024, block_size=4,
                                       max_model_len=64, enable_prefix_caching=False, split_prefill=True,
                                       prefill_interval=3))
    for i in range(3):
        scheduler.add(seq(f"a{i}", 9, max_tokens=30))
    kinds, waits, served_at = [], {}, {}
    for step in range(60):
        if step < 24:  # one arrival every step
            scheduler.add(seq(f"n{step}", 5, max_tokens=30))
            waits[f"n{step}"] = step
        got = run_step(scheduler)
        if not got:
            break
        kinds.append("P" if any(n > 1 for n in got.values()) else "D")
        for rid in got:
            served_at.setdefault(rid, step)
    assert "PP" not in "".join(kinds)
    assert all(served_at[rid] - t <= 4 for rid, t in waits.items())  # three decode steps + its prefill step
    prefills = kinds[:24].count("P")
    assert 4 <= prefills <= 8  # one prefill step per ~4 steps, not one every other step


def test_a_prefill_interval_does_not_wait_once_every_free_slot_is_asked_for():
    scheduler = Scheduler(EngineConfig(max_num_seqs=3, max_num_batched_tokens=256, num_blocks=1024, block_size=4,
                                       max_model_len=64, enable_prefix_caching=False, split_prefill=True,
                                       prefill_interval=50))
    scheduler.add(seq("a", 9, max_tokens=30))
    run_step(scheduler)
    run_step(scheduler)  # a decodes
    scheduler.add(seq("b", 5))
    assert run_step(scheduler) == {"a": 1}  # one of two free slots asked for: wait
    scheduler.add(seq("c", 5))
    assert run_step(scheduler) == {"b": 5, "c": 5}  # both free slots asked for: prefill now


def test_the_interval_is_checked():
    import pytest
    from omni.stages.ar.config import EngineConfigError

    with pytest.raises(EngineConfigError, match="prefill_interval"):
        config(prefill_interval=0)
