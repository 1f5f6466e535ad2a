"""omni as an SGLang serve backend: `sglang serve --model-type omni --model-path DIR` runs omnid.

Registered in the `sglang.serve_backends` entry-point group as `omni = "omni.api.sglang_backend:backend"`.
SGLang calls `backend()` with no arguments and expects a `ServeBackend` (API version 1); importing
this module imports nothing of SGLang until then.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

API_VERSION = 1


def _families_architectures() -> set[str]:
    from omni.models.registry import REGISTRY

    return {arch for entry in REGISTRY.families.values() for arch in entry.architectures}


def detect(request):
    """MATCH for a checkpoint whose config.json names an architecture an omni family serves."""
    from omni.vendor.sglang import serve_backends

    ServeBackendDetection = serve_backends().ServeBackendDetection
    if request.model_path is None:
        return ServeBackendDetection.UNKNOWN
    try:
        config = json.loads((Path(request.model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return ServeBackendDetection.UNKNOWN
    archs = set(config.get("architectures") or ())
    return ServeBackendDetection.MATCH if archs & _families_architectures() else ServeBackendDetection.NO_MATCH


def run(request) -> None:
    """Parse the forwarded argv as `omnid serve` flags (`--model-path` is `--model`) and serve."""
    from omni.api import cli

    parser = argparse.ArgumentParser(prog="sglang serve --model-type omni",
                                     description="omni's OpenAI-compatible server (omnid serve)")
    cli.add_serve_args(parser)
    if any(arg in ("-h", "--help") for arg in request.argv):  # help never launches a server
        parser.print_help()
        return
    code = cli.main(["serve", *request.argv])
    if code:
        raise SystemExit(code)


def backend():
    """The zero-argument factory SGLang's registry calls."""
    from omni.vendor.sglang import serve_backends

    return serve_backends().ServeBackend(api_version=API_VERSION, run=run, detect=detect, requires_model_path=False)
