"""Per-instance names on the host: the run directory for sockets and the shm segment prefix.

Every kernel instance gets a short random id; all its socket files live in one run directory
(their addresses: omni/cluster/addresses.py)
and all its shared-memory segments start with `omni-<id>-`, so cleanup after a crash is a
prefix match, and two kernels on one host never collide.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from omni import env

KERNEL = "kernel"  # the kernel's mailbox, among the actors' (`<stage>.<replica>`)


def new_instance_id() -> str:
    return secrets.token_hex(4)


def make_run_dir(instance: str) -> Path:
    # ipc:// paths are limited to ~107 bytes: keep the directory short, under /tmp.
    path = env.run_root() / f"omni-{instance}"
    path.mkdir(mode=0o700, parents=True, exist_ok=False)
    return path


def remove_socket(run_dir: str | Path, name: str) -> None:
    Path(run_dir, f"{name}.sock").unlink(missing_ok=True)


def actor_name(stage: str, replica: int) -> str:
    return f"{stage}.{replica}"


def shm_owner(instance: str, stage: str = "", replica: int = 0) -> str:
    """Prefix of the shm segments an actor owns (of the whole instance, without a stage)."""
    return f"omni-{instance}-{stage}-{replica}-" if stage else f"omni-{instance}-"
