"""The environment variables omni reads, all of them here (stage settings are stage args, not
variables: see omni/stages/args.py).

- OMNI_CACHE_DIR (else $XDG_CACHE_HOME/omni, else ~/.cache/omni): converted and exported models;
- OMNI_RUN_ROOT (else the temp dir): where each kernel run keeps its sockets and logs;
- OMNI_API_KEY: the key omnid serve asks clients for (the default of --api-key);
- OMNI_CENSUS_DIR: each stage process, and omnid itself, writes a heap / tensor census there at
  SIGUSR1 (omni/census.py; bench/soak.py --census sets it);
- OMNI_PROFILE_DIR: stage processes profile some of their steps with torch.profiler and write a
  kernel table there (omni/stages/step_profiler.py); OMNI_PROFILE_STAGES (comma-separated stage
  names, default all), OMNI_PROFILE_SKIP (steps before each window, comma-separated, default 300), OMNI_PROFILE_STEPS (steps
  profiled, default 40);
- OMNI_BUS_HOST, OMNI_NODE, OMNI_KERNEL_BUS: set by omni in stage processes placed across hosts (the IP
  their mailbox binds, the node they run on, the kernel's TCP address: omni/cluster/addresses.py);
- OMNI_NETWORK_TRANSPORT: the network channel's wire, zmq (default; nixl / mooncake are refused for now);
- OMNI_FP8_GEMM: the dense FP8 GEMM on CUDA, auto (default: cuBLAS block-scaled where its probe passes, else
  Triton), triton, or cublas (omni/layers/fp8_cublas.py);
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


def fp8_gemm() -> str:
    choice = os.environ.get("OMNI_FP8_GEMM", "auto") or "auto"
    if choice not in ("auto", "triton", "cublas"):
        raise ValueError(f"OMNI_FP8_GEMM={choice!r}: use auto, triton or cublas")
    return choice


def triton_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def profile_settings() -> tuple[str, set[str], list[int], int] | None:
    """(dir, stage names or empty for all, the steps each window starts after, steps profiled), or
    None when off."""
    where = os.environ.get("OMNI_PROFILE_DIR")
    if not where:
        return None
    names = {n for n in os.environ.get("OMNI_PROFILE_STAGES", "").split(",") if n}
    return where, names, sorted(int(n) for n in os.environ.get("OMNI_PROFILE_SKIP", "300").split(",")), int(os.environ.get("OMNI_PROFILE_STEPS", "40"))
