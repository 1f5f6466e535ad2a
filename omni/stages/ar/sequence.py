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
import operator
from dataclasses import dataclass, field
from typing import Any

from msgspec import Meta

from omni.kernel.errors import InvalidRequest
from omni.sampling import Sampling


class SamplingParams(Sampling, kw_only=True, gc=False):
    """A request's sampling as the engine runs it: the typed `Sampling` (its fields declared there,
    once) with every field the request left None resolved to `ENGINE_DEFAULTS`, plus the fields
    only a stage sets (below). Built once per request; temperature 0 means greedy (top-k/top-p/
    min-p/seed are then unused).

    Processing order follows transformers: penalties, bias and suppressed tokens, the model's
    logits processors, temperature, top-k, top-p, min-p, then one draw keyed by the seed
    (see `omni.stages.ar.sampler`).
    """

    # the engine-only fields (a stage sets them, a client never does)
    penalty_includes_prompt: bool = True  # False: output tokens only (transformers with inputs_embeds)
    stop_token_ids: tuple[int, ...] = ()  # always stop (the stop token is returned)
    suppress_token_ids: tuple[int, ...] = ()  # never sampled
    min_tokens: int = 0  # the stop ids cannot be sampled before this many output tokens (vLLM's min_tokens)

    def __post_init__(self) -> None:
        for name, value in ENGINE_DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)
        self.suppress_token_ids = tuple(int(t) for t in self.suppress_token_ids)
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        try:
            self.logit_bias = tuple((int(t), float(v)) for t, v in bias)  # (token id, added logit)
        except (TypeError, ValueError):
            raise InvalidRequest("logit_bias must map token ids to numbers") from None
        if not all(math.isfinite(v) for _, v in self.logit_bias):
            raise InvalidRequest("logit_bias values must be finite")
        _check(self)
        if self.top_k == -1:
            self.top_k = 0

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
        known = cls.__struct_fields__
        return cls(**{k: v for k, v in params.items() if k in known and v is not None})


# What a field is when neither the stage nor the request set it (seed and logprobs stay None: unseeded,
# no log-probs).
ENGINE_DEFAULTS: dict[str, Any] = {
    "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "max_tokens": 16, "ignore_eos": False, "logit_bias": (),
}

# What the engine runs, per field (`Sampling`'s annotations are OpenAI's narrower client ranges; a stage's
# own defaults or a benchmark may go past them, e.g. temperature 3). Floats must also be finite.
ENGINE_DOMAIN: dict[str, Meta] = {
    "temperature": Meta(ge=0.0),
    "top_p": Meta(gt=0.0, le=1.0),
    "min_p": Meta(ge=0.0, le=1.0),
    "repetition_penalty": Meta(gt=0.0),
    "presence_penalty": Meta(),
    "frequency_penalty": Meta(),
    "top_k": Meta(ge=-1),  # 0 = off; -1 (vLLM's and the API's "off") is read as 0
    "max_tokens": Meta(ge=1),
    "min_tokens": Meta(ge=0),
    "logprobs": Meta(ge=0, le=20),  # None: no log-probs (logprobs.py)
}
_SIGNS = (("ge", ">=", operator.ge), ("gt", ">", operator.gt), ("le", "<=", operator.le), ("lt", "<", operator.lt))
# ENGINE_DOMAIN read once: per field its (sign, bound, test) triples
_BOUNDS = tuple((name, tuple((sign, getattr(meta, attr), test) for attr, sign, test in _SIGNS
                             if getattr(meta, attr) is not None)) for name, meta in ENGINE_DOMAIN.items())


def _check(params: "SamplingParams") -> None:
    """InvalidRequest unless each field of ENGINE_DOMAIN is None or finite and within its bounds."""
    for name, bounds in _BOUNDS:
        if (value := getattr(params, name)) is None:
            continue
        try:
            finite = math.isfinite(value)
        except TypeError:
            raise InvalidRequest(f"{name} must be a number, got {value!r}") from None
        if not finite:
            raise InvalidRequest(f"{name} must be finite, got {value}")
        for sign, bound, test in bounds:
            if not test(value, bound):
                raise InvalidRequest(f"{name} must be {sign} {bound}, got {value}")


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
