"""The one module that imports SGLang: an import guard, a version check and a patch registry.

Everything else in omni reaches SGLang through `require(feature)`, which returns the `sglang`
module or raises `BackendUnavailable` saying what is missing, which version was found and how to
install the tested one, and through the helpers below. (`serve_backends()` is imported as is:
`omni.api.sglang_backend`, the entry point that *SGLang* imports to run omni as a serve backend,
only runs inside an SGLang that imported.)

Version: omni is tested with sglang `TESTED_VERSION` (0.5.17, the release that pins the H200
image's torch 2.11; the `sglang` extra in pyproject.toml pins it). Another version imports with a
warning: internals omni touches may have moved.

Model classes: `omni.vendor.sglang_models` holds classes omni adds to SGLang's model registry
(SGLang imports them in its own processes when `SGLANG_EXTERNAL_MODEL_PACKAGE` names the package):
`OmniQwen3MoeTaps` returns chosen layers' hidden states (the talker's taps); `taps_server_args`
turns such a class on for an engine (the family names its class: `ARStage.sglang_taps_model`).

Internals: the calls omni makes into SGLang beyond `sglang.Engine`'s public methods
(`abort_request`, `pool_usage`: its tokenizer manager) are here, so a moved internal is fixed once.

Patches: `PATCHES` lists the changes omni makes to SGLang at import, each a `Patch` record saying
what it fixes, the versions it applies to and when it can be deleted. `require` applies them once,
right after the first successful import; `applied()` says which ran. None is needed yet: add one
only for a real, observed defect, with a test that fails without it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import logging
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from omni.kernel.errors import BackendUnavailable

TESTED_VERSION = "0.5.17"
INSTALL_HINT = (
    f"install the tested release with `pip install 'omni[sglang]'` (sglang=={TESTED_VERSION}), "
    "or on the H200 image with ../shared/tools/sglang-gpu-kit (see its README)"
)

log = logging.getLogger("omni.vendor.sglang")


@dataclass(frozen=True)
class Patch:
    """One change to SGLang: `apply(sglang_module)` runs once, for versions in `versions`."""

    name: str
    fixes: str  # the defect, with a link or the observed symptom
    delete_when: str  # the condition (an upstream release, a fix landing) that makes it unneeded
    versions: tuple[str, ...]  # sglang versions it applies to
    apply: Callable[[ModuleType], None]


PATCHES: list[Patch] = []  # none needed yet (see the module docstring)

_state: dict[str, object] = {}  # "module" | "error" after the first probe; "applied": [names]


def installed_version() -> str | None:
    """The version pip recorded for sglang, or None when it is not installed (no import)."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _probe() -> ModuleType | None:
    if "module" not in _state and "error" not in _state:
        try:
            module = importlib.import_module("sglang")
        except Exception as exc:  # a missing dependency surfaces as any error at import time
            _state["error"] = f"{type(exc).__name__}: {exc}"
        else:
            _state["module"] = module
            _check_version()
            _apply_patches(module)
    return _state.get("module")  # type: ignore[return-value]


def import_error() -> str | None:
    """Why `import sglang` failed ("ModuleNotFoundError: No module named 'orjson'"), or None."""
    _probe()
    return _state.get("error")  # type: ignore[return-value]


def available() -> bool:
    """True when sglang imports here (its first import can take seconds)."""
    return _probe() is not None


def require(feature: str) -> ModuleType:
    """The `sglang` module, or `BackendUnavailable` naming `feature` and what is missing."""
    module = _probe()
    if module is not None:
        return module
    found = installed_version()
    found_text = f"sglang {found} is installed" if found else "sglang is not installed"
    raise BackendUnavailable(
        f"{feature} needs SGLang, but sglang is not importable: {import_error()} "
        f"({found_text}; omni is tested with {TESTED_VERSION}); {INSTALL_HINT}"
    )


def _check_version() -> None:
    found = installed_version()
    if found != TESTED_VERSION:
        log.warning("sglang %s found; omni is tested with %s: internals omni uses may differ", found, TESTED_VERSION)


def _apply_patches(module: ModuleType) -> None:
    done = _state.setdefault("applied", [])
    version = installed_version()
    for patch in PATCHES:
        if version in patch.versions and patch.name not in done:
            patch.apply(module)
            done.append(patch.name)  # type: ignore[union-attr]
            log.info("applied sglang patch %s (%s)", patch.name, patch.fixes)


def applied() -> list[str]:
    """Names of the patches applied to the imported sglang."""
    return list(_state.get("applied", []))  # type: ignore[arg-type]


def reset_for_tests() -> None:
    """Forget the probe so a test can re-run it (patches already applied are not undone)."""
    for key in ("module", "error"):
        _state.pop(key, None)


TAP_LAYERS_ENV = "OMNI_SGLANG_TAP_LAYERS"


def taps_server_args(tap_layers, model: str) -> dict[str, Any]:
    """`sglang.Engine` arguments (and environment, inherited by SGLang's processes) that serve a
    checkpoint with the taps model class `model` ("package:Class", e.g.
    "omni.vendor.sglang_models:OmniQwen3MoeTaps"; SGLang imports every module of the package):
    each returned hidden-state row is the concatenation of the residual stream entering
    `tap_layers` (ascending)."""
    package, _, architecture = model.partition(":")
    if not package or not architecture:
        raise ValueError(f"a taps model is 'package:Class', got {model!r}")
    os.environ["SGLANG_EXTERNAL_MODEL_PACKAGE"] = package
    os.environ[TAP_LAYERS_ENV] = ",".join(str(t) for t in sorted(tap_layers))
    # Radix (prefix) caching off: a cached prefix is not recomputed, so its rows would be missing
    # (seen on the H200, 2026-11-30: a repeated prompt came back with one row, its last token's).
    # Prefill eagerly: how SGLang's piecewise prefill graphs treat the captured layers is untested.
    return {"json_model_override_args": json.dumps({"architectures": [architecture]}),
            "enable_return_hidden_states": True, "disable_radix_cache": True, "disable_prefill_cuda_graph": True}


def parallel_server_args(tensor_parallel_size: int) -> dict[str, Any]:
    """`sglang.Engine` arguments for a model split over `tensor_parallel_size` GPUs: SGLang's `tp_size`
    (its ranks on base_gpu_id, base_gpu_id + 1, ..., as omni's built-in engine places them). NVLink
    multicast stays off: SGLang leaves NCCL_NVLS_ENABLE to the environment unless `enable_nccl_nvls`
    is asked for, and omni's processes keep it at 0 (omni/gpu_env.py)."""
    if int(tensor_parallel_size) < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
    return {"tp_size": int(tensor_parallel_size)} if tensor_parallel_size > 1 else {}


async def pool_usage(engine) -> dict[str, int]:
    """Requests and KV tokens in use in an `sglang.Engine`'s scheduler (its load snapshot)."""
    loads = await engine.tokenizer_manager.get_loads()
    snap = loads[0]
    return {"running": int(snap.num_running_reqs), "waiting": int(snap.num_waiting_reqs),
            "used_tokens": int(snap.num_used_tokens), "capacity": int(snap.max_total_num_tokens)}


def abort_request(engine, rid: str) -> None:
    """Stop request `rid` of an `sglang.Engine` (its scheduler frees the KV when the abort reaches
    it); called on the engine's event loop."""
    engine.tokenizer_manager.abort_request(rid)


def serve_backends() -> ModuleType:
    """`sglang.cli.serve_backends`, SGLang's serve-backend plugin API (`ServeBackend`,
    `ServeBackendDetection`), for omni's backend that SGLang itself calls."""
    return importlib.import_module("sglang.cli.serve_backends")
