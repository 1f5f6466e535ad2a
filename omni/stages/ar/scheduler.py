"""Continuous batching with chunked prefill under a token budget; preemption by recompute.

Each step spends at most `max_num_batched_tokens` tokens:
1. running sequences first, in admission order (decodes take 1 token, unfinished prefills a
   chunk). A sequence whose input is not ready (`ready(seq)` false: e.g. a talker waiting
   for the thinker's next hidden state) is skipped and keeps its blocks. When blocks run
   out, the newest running sequence is preempted: its blocks return and it goes back to
   the head of the waiting queue to be recomputed later.
2. then waiting sequences, first come first served, while `max_num_seqs` and blocks allow.
   With prefix caching a sequence being admitted first shares the cached blocks that match its
   leading full blocks (`BlockManager.match`): its computation starts past them.
With `prefill_apart` (the default under decode graphs) a step either prefills (admissions and
prompt chunks of more than one token) or decodes (one token per sequence, a step the engine
replays from a CUDA graph), never both; while both kinds wait they alternate, so a decode
waits at most one prefill step and a new request at most `prefill_interval` decode steps (1 by
default; more batches a busy engine's arrivals into fewer prefill steps, unless they would fill
every free slot already).

Why no deadlock: the config guarantees one `max_model_len` sequence fits the cache, and
the oldest running sequence may preempt every newer one, so it always progresses.
No torch here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from omni.stages.ar.block_manager import BlockManager, KeyFn
from omni.stages.ar.config import EngineConfig
from omni.stages.ar.sequence import FinishReason, Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_tokens: int  # tokens computed this step, from seq.num_computed_tokens on

    @property
    def start(self) -> int:
        return self.seq.num_computed_tokens

    @property
    def end(self) -> int:
        return self.seq.num_computed_tokens + self.num_tokens

    @property
    def samples(self) -> bool:
        """True when this step reaches the sequence's last token, so a new one is sampled."""
        return self.end == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)


def _always_ready(seq: Sequence) -> bool:
    return True


class Scheduler:
    def __init__(self, config: EngineConfig, ready: Callable[[Sequence], bool] | None = None,
                 prefix_key: KeyFn | None = None) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.chunked_prefill = config.enable_chunked_prefill
        self.blocks = BlockManager(config.num_blocks, config.block_size, caching=config.enable_prefix_caching,
                                   key_fn=prefix_key, tapping=bool(config.tap_layers))
        self.ready = ready or _always_ready
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.prefill_apart = config.prefill_apart
        self.last_prefilled = False  # the last step was a prefill step (prefill_apart)
        self.prefill_interval = config.prefill_interval
        self.decodes_since_prefill = 0  # decode steps since the last prefill step (prefill_apart)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def has_ready(self) -> bool:
        """True when `schedule` would schedule something now (no side effects).

        Mirrors `schedule`'s admission rule, so an engine whose blocks are all held by
        parked sequences reports no work instead of spinning.
        """
        if any(self.ready(s) for s in self.running):
            return True
        return self._can_admit()

    def _can_admit(self) -> bool:
        """The first ready waiting sequence can be admitted now (no side effects)."""
        if len(self.running) >= self.max_num_seqs:
            return False
        for seq in self.waiting:
            if self.ready(seq):
                hits, cached, left = self._lookup(seq)
                if not self.chunked_prefill and left > self.max_num_batched_tokens:
                    return False
                return self.blocks.can_admit(seq, hits, cached + min(left, self.max_num_batched_tokens))
        return False

    def decodes_only(self, seqs: list[Sequence]) -> bool:
        """The next step would decode exactly `seqs` (the sequences of a decode step in flight): nobody
        could be admitted and no other running sequence is ready (lookahead.py)."""
        if self.waiting and self._can_admit():
            return False
        ids = {id(s) for s in seqs}
        return not any(s.num_uncomputed_tokens > 0 and id(s) not in ids and self.ready(s) for s in self.running)

    def _lookup(self, seq: Sequence) -> tuple[list[int], int, int]:
        """A waiting sequence's cached blocks, the tokens they hold, and the tokens left to compute."""
        hits = self.blocks.match(seq)
        cached = len(hits) * self.blocks.block_size
        return hits, cached, seq.num_tokens - cached

    def schedule(self) -> SchedulerOutput:
        if not self.prefill_apart:
            return self._schedule(decodes=True, prefills=True)
        prefill = self._prefill_due()
        out = self._schedule(decodes=not prefill, prefills=prefill)
        if prefill and not (out.scheduled or out.preempted):  # nothing could be admitted after all
            prefill, out = False, self._schedule(decodes=True, prefills=False)
        self.last_prefilled = prefill
        self.decodes_since_prefill = 0 if prefill else self.decodes_since_prefill + 1
        return out

    def _prefill_due(self) -> bool:
        """This step prefills: prefill work is ready and decodes did not just wait for a prefill step."""
        ready = [s for s in self.running if s.num_uncomputed_tokens > 0 and self.ready(s)]
        decodes = any(s.num_uncomputed_tokens == 1 for s in ready)
        if decodes and self.last_prefilled:
            return False
        if decodes and self.decodes_since_prefill < self.prefill_interval and not self._slots_all_asked_for():
            return False  # gather this interval's arrivals into one prefill step
        return any(s.num_uncomputed_tokens > 1 for s in ready) or self._can_admit()

    def _slots_all_asked_for(self) -> bool:
        """As many ready sequences wait as there are free slots: waiting longer gathers nothing more."""
        free = self.max_num_seqs - len(self.running)
        return free > 0 and sum(1 for s in self.waiting if self.ready(s)) >= free

    def _schedule(self, decodes: bool, prefills: bool) -> SchedulerOutput:
        """Running sequences, then admissions (`prefills`); `decodes` / `prefills` pick which running
        ones take part (one token left: a decode)."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            left = seq.num_uncomputed_tokens
            if left == 0 or not self.ready(seq) or not (decodes if left == 1 else prefills):
                i += 1
                continue
            n = min(left, budget)
            if not self._make_room(seq, seq.num_computed_tokens + n, out):
                break  # `seq` itself was preempted; everything after it already was
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
            i += 1
        if out.preempted or not prefills:
            return out  # memory is tight (or a decode step): admit nobody new this step
        for seq in list(self.waiting):
            if budget <= 0 or len(self.running) >= self.max_num_seqs:
                break
            if not self.ready(seq):
                continue
            hits, cached, n = self._lookup(seq)
            if n > budget:
                if not self.chunked_prefill:
                    break
                n = budget
            if not self.blocks.can_admit(seq, hits, cached + n):
                break
            self.blocks.admit(seq, hits)
            self.blocks.allocate(seq, cached + n)
            self.waiting.remove(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        return out

    def _make_room(self, seq: Sequence, num_tokens: int, out: SchedulerOutput) -> bool:
        """Allocate blocks for `seq`, preempting the newest running sequences if needed."""
        if self.blocks.blocks_needed(seq, num_tokens) == 0:
            return True  # most decode steps: the last block still has room
        while not self.blocks.can_allocate(seq, num_tokens):
            victim = self.running[-1]
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False
        self.blocks.allocate(seq, num_tokens)
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Take `seq` out (running or waiting) and return its blocks at once."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.blocks.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
