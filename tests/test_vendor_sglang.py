"""The SGLang vendor module's import guard and the AR stages' `backend` choice, on CPU.

Here sglang is installed without its dependencies, so its import fails: the guard must say so,
and `backend="sglang"` must fail at stage start-up with that message, naming the stage. The
SGLang-backed engine's mapping is tested with a stand-in engine (test_sglang_engine_mapping.py) and
the real one on the GPU (test_sglang_gpu.py).
"""

from __future__ import annotations

import asyncio
import importlib
import re
import sys
from pathlib import Path

import pytest

from omni.kernel.errors import BackendUnavailable, OmniError, StageStartError, error_from_kind
from omni.config import apply_overrides, parse_set_flags
from omni.kernel.kernel import Kernel
from omni.vendor import sglang as vendor

REPO = Path(__file__).resolve().parents[1]


def real_import_error() -> str | None:
    """What `import sglang` does in this interpreter, found independently of the vendor module."""
    try:
        importlib.import_module("sglang")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


needs_broken_sglang = pytest.mark.skipif(real_import_error() is None, reason="sglang imports here")


@pytest.fixture(autouse=True)
def fresh_probe():
    vendor.reset_for_tests()
    yield
    vendor.reset_for_tests()


@needs_broken_sglang
def test_guard_reports_the_real_import_error():
    assert vendor.available() is False
    assert vendor.import_error() == real_import_error()


def test_require_raises_typed_error_with_version_and_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)  # makes `import sglang` fail, whatever is installed
    with pytest.raises(BackendUnavailable) as info:
        vendor.require("the test feature")
    message = str(info.value)
    assert isinstance(info.value, OmniError) and info.value.kind == "backend_unavailable"
    assert "the test feature needs SGLang, but sglang is not importable: ModuleNotFoundError: import of sglang halted" in message
    found = vendor.installed_version()
    assert (f"sglang {found} is installed" if found else "sglang is not installed") in message
    assert f"tested with {vendor.TESTED_VERSION}" in message
    assert "pip install 'omni[sglang]'" in message and "sglang-gpu-kit" in message
    assert isinstance(error_from_kind("backend_unavailable", message), BackendUnavailable)


def test_require_returns_module_and_applies_registered_patches_once(monkeypatch):
    fake = type(sys)("sglang")
    calls = []
    monkeypatch.setitem(sys.modules, "sglang", fake)
    monkeypatch.setattr(vendor, "installed_version", lambda: vendor.TESTED_VERSION)
    monkeypatch.setattr(vendor, "PATCHES", [
        vendor.Patch("demo", "nothing: a test record", "never", (vendor.TESTED_VERSION,), calls.append),
        vendor.Patch("other-version", "nothing", "never", ("0.0.1",), calls.append),
    ])
    monkeypatch.setitem(vendor._state, "applied", [])
    assert vendor.require("x") is fake and vendor.available()
    vendor.reset_for_tests()
    assert vendor.require("x") is fake
    assert calls == [fake] and vendor.applied() == ["demo"]


def test_no_patches_registered_yet():
    assert vendor.PATCHES == []  # add one only with a test that fails without it


def test_only_the_vendor_module_imports_sglang():
    """Imports of sglang and its internals (the engine's tokenizer manager) live in omni/vendor only,
    omni's serve backend for SGLang (omni.api.sglang_backend) included."""
    imports = re.compile(r"^\s*(import sglang\b|from sglang\b)", re.M)
    internals = re.compile(r"tokenizer_manager|[\"']sglang\.")
    offenders = [
        str(path.relative_to(REPO)) for path in (REPO / "omni").rglob("*.py")
        if REPO / "omni/vendor" not in path.parents and (imports.search(path.read_text())
                                                         or internals.search(path.read_text()))
    ]
    assert offenders == []
    assert not imports.search((REPO / "omni/vendor/sglang.py").read_text())  # it imports by name, guarded


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny

    return str(make_tiny(tmp_path_factory.mktemp("tiny-a"), seed=0, preset="tiny-a"))


def text_graph(model_dir: str, flags: list[str]):
    from omni.models.qwen3_omni.graph import build

    graph, _ = build(model_dir, "text", threads=1)
    return apply_overrides(graph, parse_set_flags(flags))


@needs_broken_sglang
def test_sglang_backend_fails_at_startup_naming_the_stage(tiny_dir):
    graph = text_graph(tiny_dir, ["thinker.args.backend=sglang"])

    async def main():
        with pytest.raises(StageStartError) as info:
            await Kernel(graph, mode="process").start()
        return str(info.value)

    message = asyncio.run(main())
    assert "stage thinker.0 failed to start: BackendUnavailable" in message
    assert "sglang is not importable" in message and "pip install 'omni[sglang]'" in message


def test_unknown_backend_fails_at_setup(tiny_dir):
    from omni.kernel.errors import GraphError
    from omni.kernel.stage import StageContext
    from omni.models.qwen3_omni.stages.thinker_stage import ThinkerStage

    stage = ThinkerStage(StageContext(name="thinker", args={"model_dir": tiny_dir, "backend": "vllm"}))
    with pytest.raises(GraphError, match=r"thinker.*args.backend must be one of \('builtin', 'sglang'\)"):
        stage.setup()


def test_builtin_backend_unaffected(tiny_dir):
    """Default and explicit "builtin" build the built-in engine and give the same greedy tokens."""
    from omni.kernel.stage import StageContext
    from omni.models.qwen3_omni.stages.thinker_stage import ThinkerStage
    from omni.stages.ar.engine import AREngine
    from omni.stages.ar.sequence import SamplingParams

    tokens = []
    for extra in ({}, {"backend": "builtin"}):
        stage = ThinkerStage(StageContext(name="thinker", args={"model_dir": tiny_dir, **extra}))
        stage.setup()
        assert type(stage.engine) is AREngine and stage.backlog() == 0
        tokens.append(stage.engine.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.0, max_tokens=4)))
    assert tokens[0] == tokens[1] and len(tokens[0][0]) >= 1
