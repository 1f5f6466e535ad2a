"""The environment variables omni reads, all of them here (stage settings are stage args, not
variables: see omni/stages/args.py).

- OMNI_CACHE_DIR (else $XDG_CACHE_HOME/omni, else ~/.cache/omni): converted and exported models;
- OMNI_RUN_ROOT (else the temp dir): where each kernel run keeps its sockets and logs;
- OMNI_API_KEY: the key omnid serve asks clients for (the default of --api-key);
- OMNI_CENSUS_DIR: each stage process writes a heap / tensor census there at SIGUSR1 (omni/census.py;
  bench/soak.py --census sets it);
- TRITON_INTERPRET=1 (triton's own): its kernels run on the CPU interpreter (tests).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    if os.environ.get("OMNI_CACHE_DIR"):
        return Path(os.environ["OMNI_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "omni"


def run_root() -> Path:
    return Path(os.environ.get("OMNI_RUN_ROOT") or tempfile.gettempdir())


def api_key() -> str | None:
    return os.environ.get("OMNI_API_KEY") or None


def census_dir() -> str | None:
    return os.environ.get("OMNI_CENSUS_DIR") or None


def triton_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"
