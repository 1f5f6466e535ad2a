"""Requests as the engine sees them: sampling parameters and the per-sequence state.

Plain Python, no torch: the scheduler and block manager work on these objects only.
A sequence's tokens are `prompt_token_ids + output_token_ids`; `num_computed_tokens`
of them have their keys/values in the paged cache. The newest sampled token is never
computed yet: the next step feeds it.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from omni.kernel.errors import InvalidRequest


@dataclass
class SamplingParams:
    """Per-request sampling; temperature 0 means greedy (top-k/top-p/min-p/seed are then unused).

    Processing order follows transformers: penalties, bias and suppressed tokens, the model's
    logits processors, temperature, top-k, top-p, min-p, then one draw keyed by the seed
    (see `omni.stages.ar.sampler`).
    """

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0  # drop tokens below min_p x the top probability (0 = off)
    repetition_penalty: float = 1.0  # over prompt and output tokens, as transformers does
    penalty_includes_prompt: bool = True  # False: output tokens only (transformers with inputs_embeds)
    presence_penalty: float = 0.0  # OpenAI's: minus this for every token already output
    frequency_penalty: float = 0.0  # OpenAI's: minus this times the token's output count
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added logit); a dict is accepted
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()  # always stop (the stop token is returned)
    ignore_eos: bool = False  # do not stop on the engine's EOS ids
    suppress_token_ids: tuple[int, ...] = ()  # never sampled
    min_tokens: int = 0  # the stop ids cannot be sampled before this many output tokens (vLLM's min_tokens)
    logprobs: int | None = None  # report each sampled token's log-prob and this many alternatives (logprobs.py)

    def __post_init__(self) -> None:
        self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)
        self.suppress_token_ids = tuple(int(t) for t in self.suppress_token_ids)
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        try:
            self.logit_bias = tuple((int(t), float(v)) for t, v in bias)
        except (TypeError, ValueError):
            raise InvalidRequest("logit_bias must map token ids to numbers") from None
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            if not math.isfinite(float(getattr(self, name))):
                raise InvalidRequest(f"{name} must be finite, got {getattr(self, name)}")
        if not all(math.isfinite(v) for _, v in self.logit_bias):
            raise InvalidRequest("logit_bias values must be finite")
        if self.temperature < 0:
            raise InvalidRequest(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InvalidRequest(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequest(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise InvalidRequest(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise InvalidRequest(f"logprobs must be within [0, 20], got {self.logprobs}")
        if self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise InvalidRequest(f"min_tokens must be >= 0, got {self.min_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def neutral(self) -> bool:
        """No penalty, bias or suppressed id: the logits go to the draw as the model made them."""
        return (self.repetition_penalty == 1.0 and self.presence_penalty == 0.0 and self.frequency_penalty == 0.0
                and not self.logit_bias and not self.suppress_token_ids and not self.min_tokens)

    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> "SamplingParams":
        """Read the known keys of a request's params (unknown keys are ignored)."""
        known = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in params.items() if k in known and v is not None}
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise InvalidRequest(f"bad sampling parameters: {exc}") from None


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # not admitted, or preempted (holds no blocks)
    RUNNING = "running"  # admitted, holds blocks
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # an EOS or stop token was sampled
    LENGTH = "length"  # max_tokens or max_model_len reached
    ABORT = "abort"


_arrival = itertools.count()


@dataclass(eq=False)
class Sequence:
    """One request inside the engine.

    `model_state` belongs to the model adapter (e.g. merged multimodal embeddings, M-RoPE
    positions, the talker's codes); the engine never reads it. `return_hidden` asks for
    the hidden-state taps of every processed token.
    """

    rid: str
    prompt_token_ids: list[int]
    params: SamplingParams
    return_hidden: bool = False
    model_state: dict[str, Any] = field(default_factory=dict)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_tapped_tokens: int = 0  # positions whose taps were already returned (survives preemption)
    block_table: list[int] = field(default_factory=list)
    # prefix caching (block_manager.py): chained content hashes of the first full blocks (kept
    # across preemption: they depend on the tokens only), how many leading blocks of the table are
    # in the cache, whether the model opted out from some block on, prompt tokens served by the cache
    block_hashes: list[bytes] = field(default_factory=list)
    num_cached_blocks: int = 0
    uncacheable: bool = False
    num_cached_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    sample_slot: int | None = None  # the sampler's state row while running (see sampler.Sampler)
    sample_seed: int | None = None  # params.seed, or a random one drawn at first admission
    arrival: int = field(default_factory=lambda: next(_arrival))

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def token_ids(self, start: int, end: int) -> list[int]:
        """Token ids at positions [start, end) of prompt + output."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids
