"""NVLink multicast stays off in every process omni starts.

A program that uses NVLink SHARP / multicast can put a host's shared GPUs out of service, so the
machines omni is built on set these variables, and omni keeps them set: each is given its "off"
value where it is unset, in the server, in every stage process (also one started with an `env` of
its own) and in the ranks of a tensor-parallel stage. A value already set is left alone.
"""

from __future__ import annotations

import os
from typing import MutableMapping

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",  # NCCL: no NVLink SHARP (NVLS) collectives
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",  # PyTorch symmetric memory: no multicast objects
    "NVSHMEM_DISABLE_NVLS": "1",  # NVSHMEM (used by some MoE kernels): no NVLS
}


def keep_multicast_off(env: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
    """Fill the unset MULTICAST_OFF variables into `env` (default: this process's environment)."""
    env = os.environ if env is None else env
    for key, value in MULTICAST_OFF.items():
        env.setdefault(key, value)
    return env
