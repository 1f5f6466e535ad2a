"""The embedded default model: a tiny RANDOM-weight Qwen3-Omni that `omnid serve` serves when no
--model is given, made once with make_tiny into omnid's cache dir (a few MB, about a second)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from omni.models.qwen3_omni.checkpoint.make_tiny import TINY_MARKER, make_tiny

EMBEDDED_PRESET, EMBEDDED_SEED = "tiny-a", 0


def embedded_model(cache_dir: Path) -> str:
    path = Path(cache_dir) / f"qwen3-omni-{EMBEDDED_PRESET}-seed{EMBEDDED_SEED}"
    if not (path / TINY_MARKER).is_file():
        print(f"omnid: making the embedded tiny Qwen3-Omni (random weights) in {path}", flush=True)
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        try:
            make_tiny(tmp, seed=EMBEDDED_SEED, preset=EMBEDDED_PRESET)
            if not path.exists():
                os.replace(tmp, path)
        except OSError as exc:
            if not (path / TINY_MARKER).is_file():  # not a lost race with another omnid
                raise OSError(f"cannot write the embedded model to {path}: {exc}") from None
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return str(path)
