"""A request's sampling for one stage, its fields written once (a contract the API, the bus and the
stages share; the kernel carries it but runs none of it, so it lives beside the kernel, not in it).

`SamplingFields` are what a client may set (OpenAI's ranges): the API's request bodies take them
at the top level and in `stage_sampling` (so their OpenAPI schema comes from here too). `Sampling`
adds what the API derives (token-id logit bias, log-prob alternatives) and rides typed on the bus
in `RequestOpen.sampling`, keyed by stage name. None everywhere means "the stage's default": a
stage merges these under its defaults in one place (omni/stages/sampling.py).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from omni.kernel.errors import InvalidRequest

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
TopK = Annotated[int, Meta(ge=-1)]
MaxTokens = Annotated[int, Meta(ge=1, le=1 << 20)]
Seed = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
RepetitionPenalty = Annotated[float, Meta(gt=0.0, le=10.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]  # OpenAI's presence / frequency range
MinP = Annotated[float, Meta(ge=0.0, le=1.0)]


class SamplingFields(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The sampling a client sets; None: the stage's default."""

    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    max_tokens: MaxTokens | None = None
    seed: Seed | None = None
    ignore_eos: bool | None = None  # generate exactly max_tokens (benchmarks compare equal work)


class Sampling(SamplingFields, kw_only=True, forbid_unknown_fields=True, gc=False):
    """One stage's sampling as the request sets it, on the bus."""

    logit_bias: dict[int, float] | None = None  # token id -> added logit
    logprobs: int | None = None  # report each token's log-prob with this many alternatives

    def given(self) -> dict[str, Any]:
        """The fields the request set."""
        return {name: value for name in self.__struct_fields__ if (value := getattr(self, name)) is not None}


SamplingTable = dict[str, Sampling]  # stage name -> its sampling


def split_sampling(params: dict[str, Any]) -> tuple[dict[str, Any], SamplingTable]:
    """A request's params without `sampling`, and its sampling typed (a library caller may pass
    plain dicts: they are checked here, a bad one is InvalidRequest before anything runs)."""
    if "sampling" not in params:
        return params, {}
    rest = {k: v for k, v in params.items() if k != "sampling"}
    try:
        return rest, msgspec.convert(params["sampling"] or {}, SamplingTable)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"bad sampling parameters: {exc}") from None
