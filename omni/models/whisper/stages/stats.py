"""What verbose_json reports of one decoding pass, with openai-whisper's and transformers' meaning.

`avg_logprob`: the chosen tokens' log-probabilities under the decoding rules (suppression and the
timestamp grammar applied, temperature not), end-of-text included, summed and divided by the text
tokens + 1. `no_speech_prob`: the probability of <|nospeech|> (<|nocaptions|> in English-only
models) in the raw logits at <|startoftranscript|>. `compression_ratio`: the text's bytes over its
zlib-compressed bytes (high for a model stuck repeating itself).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

STATS = "stats"  # key in seq.model_state


@dataclass
class DecodeStats:
    no_speech: int | None = None  # read no_speech_prob at this pass's first step (its prompt ends at SOT)
    sum_logprobs: bool = True  # False for a probe, which only reads no_speech_prob
    sum_logprob: float = 0.0
    no_speech_prob: float | None = None
    avg_logprob: float | None = None  # set by `finish`
    row: torch.Tensor | None = None  # this step's logits as the rules left them (WhisperRules sets it)

    def before_rules(self, logits: torch.Tensor, output: list[int]) -> None:
        """One row of raw logits, before the rules masked it."""
        if self.no_speech is not None and not output:
            self.no_speech_prob = float(torch.softmax(logits.float(), -1)[self.no_speech])

    def after_sample(self, logits: torch.Tensor, token: int) -> None:
        """The row as the sampler drew from it (rules applied, temperature not), and its draw."""
        if self.sum_logprobs:
            self.sum_logprob += float(torch.log_softmax(logits.float(), -1)[token])

    def finish(self, num_text_tokens: int) -> None:
        """The pass is over: `num_text_tokens` were sampled before end-of-text (timestamps count)."""
        self.avg_logprob = self.sum_logprob / (num_text_tokens + 1)


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0
