"""Overload degrades fairly: a new turn's work is not starved by other sessions' work.

- The audio encoder stage batches the oldest pending input's key: a short clip (a pad_len of its
  own) is encoded in the next forward even while clips of a busier key keep arriving (it used to
  wait for the largest group, i.e. for as long as the others kept coming).
- The thinker's scheduler gives decodes one token each and a new prefill the rest of the token
  budget in the very next step, whatever the number of decoding sessions below `max_num_seqs`;
  at `max_num_seqs` waiting prompts are admitted first come first served as decodes finish.
"""

from __future__ import annotations

import numpy as np

from omni.kernel.stage import StageContext
from omni.stages.ar.config import EngineConfig
from omni.stages.ar.scheduler import Scheduler
from omni.stages.ar.sequence import FinishReason, SamplingParams, Sequence
from omni.stages.encoder import EncoderStage


class Keyed:
    """A stand-in encoder whose batch key is the item's `key`; it records each forward's keys."""

    def __init__(self) -> None:
        self.forwards: list[list[int]] = []

    def batch_key(self, item):
        return int(item["key"])

    def encode(self, items):
        self.forwards.append([int(it["key"]) for it in items])
        return [{"rows": np.zeros(1, np.float32)} for _ in items]


def submit(stage: EncoderStage, rid: str, key: int) -> None:
    stage.open(rid, {})
    stage.feed(rid, "in", {"key": key, "x": np.array([hash(rid) % 1000])})
    stage.close_input(rid)


def test_a_lone_key_is_encoded_next_while_a_busier_key_keeps_arriving():
    encoder = Keyed()
    stage = EncoderStage(StageContext(name="enc", args={"max_batch": 4}), encoder=encoder)
    for i in range(6):
        submit(stage, f"long{i}", 100)
    submit(stage, "short", 37)
    finished = []
    for step in range(6):
        for i in range(3):  # more of the busy key arrive every step
            submit(stage, f"more{step}.{i}", 100)
        finished += [e.rid for e in stage.step() if e.finish]
        if "short" in finished:
            break
    assert "short" in finished and step <= 2, encoder.forwards


def seq(rid: str, n: int) -> Sequence:
    return Sequence(rid, list(range(1, n + 1)), SamplingParams())


def run_step(scheduler: Scheduler) -> dict[str, int]:
    out = scheduler.schedule()
    for s in out.scheduled:
        samples = s.samples
        s.seq.num_computed_tokens += s.num_tokens
        if samples:
            s.seq.output_token_ids.append(7)
    return {s.seq.rid: s.num_tokens for s in out.scheduled}


def test_a_new_prefill_gets_the_budget_left_by_every_decode_at_once():
    config = EngineConfig(max_num_seqs=32, max_num_batched_tokens=256, num_blocks=4096, block_size=16,
                          enable_prefix_caching=False)
    scheduler = Scheduler(config)
    for i in range(31):
        scheduler.add(seq(f"d{i}", 8))
    run_step(scheduler)  # 31 short prompts prefilled together
    assert all(s.output_token_ids for s in scheduler.running)
    scheduler.add(seq("turn", 1000))
    got = run_step(scheduler)
    assert got["turn"] == 256 - 31 and all(got[f"d{i}"] == 1 for i in range(31))  # nobody waits
    turn = scheduler.running[-1]
    while turn.num_computed_tokens < 1000:  # every step of the prefill: the same share, every decode served
        left = 1000 - turn.num_computed_tokens
        got = run_step(scheduler)
        assert got["turn"] == min(256 - 31, left) and len(got) == 32


def test_at_max_num_seqs_waiting_prompts_enter_first_come_first_served():
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=256, num_blocks=4096, block_size=16,
                          enable_prefix_caching=False)
    scheduler = Scheduler(config)
    decodes = [seq(f"d{i}", 8) for i in range(4)]
    for s in decodes:
        scheduler.add(s)
    run_step(scheduler)
    for name in ("first", "second"):
        scheduler.add(seq(name, 20))
    assert "first" not in run_step(scheduler)  # no slot
    scheduler.finish(decodes[2], FinishReason.STOP)
    assert "first" in run_step(scheduler) and "second" not in run_step(scheduler)
    scheduler.finish(decodes[0], FinishReason.STOP)
    assert "second" in run_step(scheduler)
