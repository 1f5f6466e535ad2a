"""A stage's sampling for one request, merged in one place: the stage's defaults, then what the
request set for this stage (`params["sampling"][stage name]`, a `Sampling` as the bus carries it),
then what the stage fixes (its stop ids, ...). Every autoregressive stage calls `merged_sampling`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from omni.kernel.errors import InvalidRequest
from omni.sampling import Sampling
from omni.stages.ar.sequence import SamplingParams


def request_sampling(params: Mapping[str, Any], stage: str) -> Sampling | None:
    """What the request set for `stage` (a stage driven in-process may be handed plain dicts)."""
    given = (params.get("sampling") or {}).get(stage)
    if given is None or isinstance(given, Sampling):
        return given
    try:
        return msgspec.convert(given, Sampling)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"bad sampling parameters for stage {stage!r}: {exc}") from None


def merged_sampling(defaults: Mapping[str, Any], params: Mapping[str, Any], stage: str,
                    fix=None) -> SamplingParams:
    """`defaults` under the request's fields for `stage`; `fix(merged)` may then set what the
    stage decides itself (it gets the merged dict and changes it in place)."""
    merged = dict(defaults)
    if (given := request_sampling(params, stage)) is not None:
        merged.update(given.given())
    if fix is not None:
        fix(merged)
    return SamplingParams.from_dict(merged)
