"""Per-instance names on the host: the run directory for sockets and the shm segment prefix.

Every kernel instance gets a short random id; all its socket files live in one run directory
and all its shared-memory segments start with `omni-<id>-`, so cleanup after a crash is a
prefix match, and two kernels on one host never collide.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

from omni import env

SHM_DIR = Path("/dev/shm")


def new_instance_id() -> str:
    return secrets.token_hex(4)


def make_run_dir(instance: str) -> Path:
    # ipc:// paths are limited to ~107 bytes: keep the directory short, under /tmp.
    base = env.run_root()
    path = base / f"omni-{instance}"
    path.mkdir(mode=0o700, parents=True, exist_ok=False)
    return path


def endpoint(run_dir: str | Path, name: str) -> str:
    return f"ipc://{run_dir}/{name}.sock"


def actor_name(stage: str, replica: int) -> str:
    return f"{stage}.{replica}"


def shm_owner(instance: str, stage: str, replica: int) -> str:
    """Prefix of the shm segments an actor owns (the kernel unlinks it when the actor dies)."""
    return f"omni-{instance}-{stage}-{replica}-"


def unlink_shm_prefix(prefix: str) -> list[str]:
    """Remove every /dev/shm entry whose name starts with `prefix`; returns the names removed."""
    removed = []
    if not SHM_DIR.is_dir():
        return removed
    for entry in SHM_DIR.iterdir():
        if entry.name.startswith(prefix):
            try:
                entry.unlink()
                removed.append(entry.name)
            except FileNotFoundError:
                pass
    return removed


def remove_socket(run_dir: str | Path, name: str) -> None:
    try:
        (Path(run_dir) / f"{name}.sock").unlink()
    except FileNotFoundError:
        pass


def remove_run_dir(run_dir: str | Path) -> None:
    shutil.rmtree(run_dir, ignore_errors=True)
