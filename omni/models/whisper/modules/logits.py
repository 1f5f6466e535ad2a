"""Whisper's decoding rules: a logits processor of the engine's one sampler.

Per sequence (`DecodeRules` in `seq.model_state["rules"]`), in transformers' order: the tokens
suppressed at the first generated position (`begin_suppress`), the tokens always suppressed,
then, when timestamps are on, the timestamp grammar: timestamps come in pairs (except right
before end-of-text), never decrease, the first token is a timestamp no later than
`max_initial_timestamp_index`, and when the timestamps together are likelier than any text
token a timestamp is taken. A language-detection sequence may only produce language tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omni.models.whisper.stages.stats import STATS
from omni.stages.ar.sampler import LogitsProcessor
from omni.stages.ar.sequence import Sequence

RULES = "rules"  # key in seq.model_state
NEG_INF = float("-inf")


@dataclass
class DecodeRules:
    eot: int
    no_timestamps: int
    timestamp_begin: int
    suppress: tuple[int, ...] = ()
    begin_suppress: tuple[int, ...] = ()
    timestamps: bool = False
    max_initial_timestamp_index: int | None = 50
    allowed: tuple[int, ...] = ()  # when set, only these ids (language detection)

    def apply(self, logits: torch.Tensor, output: list[int]) -> None:
        """Mask one row of logits in place, given the tokens generated so far."""
        if self.allowed:
            keep = torch.full_like(logits, NEG_INF)
            idx = torch.tensor(self.allowed, device=logits.device)
            keep[idx] = logits[idx]
            logits.copy_(keep)
            return
        if not output and self.begin_suppress:
            logits[list(self.begin_suppress)] = NEG_INF
        if self.suppress:
            logits[list(self.suppress)] = NEG_INF
        if self.timestamps:
            self._timestamp_rules(logits, output)

    def _timestamp_rules(self, logits: torch.Tensor, output: list[int]) -> None:
        tb = self.timestamp_begin
        logits[self.no_timestamps] = NEG_INF
        last_ts = len(output) >= 1 and output[-1] >= tb
        penultimate_ts = len(output) < 2 or output[-2] >= tb
        if last_ts:
            if penultimate_ts:
                logits[tb:] = NEG_INF  # a pair just closed: text (or end) must follow
            else:
                logits[: self.eot] = NEG_INF  # an open pair: a timestamp or the end
        stamps = [t for t in output if t >= tb]
        if stamps:
            floor = stamps[-1] if last_ts and not penultimate_ts else stamps[-1] + 1
            logits[tb:floor] = NEG_INF
        if not output:
            logits[:tb] = NEG_INF
            if self.max_initial_timestamp_index is not None:
                logits[tb + self.max_initial_timestamp_index + 1:] = NEG_INF
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        if logprobs[tb:].logsumexp(-1) > logprobs[:tb].max():
            logits[:tb] = NEG_INF


class WhisperRules(LogitsProcessor):
    """Each sequence's `DecodeRules` mask its row. They read the host token history, so
    Whisper's steps sample eagerly (not inside a decode graph). Sequences with `DecodeStats`
    (verbose_json) have their no-speech probability read before the rules and keep the row as
    the rules left it; the decoder's `after_sample` reads the drawn token's log-probability."""

    graph_safe = False

    def __call__(self, logits: torch.Tensor, slots: torch.Tensor, seqs: list[Sequence] | None) -> torch.Tensor:
        seqs = seqs or []
        rows = [i for i, s in enumerate(seqs) if RULES in s.model_state]
        timed = [i for i, s in enumerate(seqs) if STATS in s.model_state]
        for i in timed:
            seqs[i].model_state[STATS].before_rules(logits[i], seqs[i].output_token_ids)
        if rows:
            logits = logits.clone()
            for i in rows:
                seqs[i].model_state[RULES].apply(logits[i], seqs[i].output_token_ids)
        for i in timed:
            seqs[i].model_state[STATS].row = logits[i]
        return logits
