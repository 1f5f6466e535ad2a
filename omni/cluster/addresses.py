"""The control bus's address book, for actors on several hosts.

On one host every mailbox is an ipc:// socket file whose name is known in advance. Across hosts a
mailbox binds a free TCP port on its node's IP ($OMNI_BUS_HOST, set by the host that placed it), so
peers must be told: each actor reports (address, node) in ActorReady, the kernel passes it on in
PeerUpdate (and in a restarted replica's config), and every process keeps what it learned here.
`$OMNI_NODE` names the node a process runs on; two actors on different nodes talk through the
network channel, never shm.
"""

from __future__ import annotations

import os
from pathlib import Path

_BOOK: dict[tuple[str, str], tuple[str, str]] = {}  # (run_dir, actor) -> (tcp address, node)


def endpoint(run_dir: str | Path, name: str) -> str:
    """Where `name` listens: its TCP address once learned (the kernel's is $OMNI_KERNEL_BUS, which the
    kernel gives each stage process), else its ipc:// socket file in the run directory."""
    if name == "kernel" and os.environ.get("OMNI_KERNEL_BUS", "").startswith("tcp://"):
        return os.environ["OMNI_KERNEL_BUS"]
    return _BOOK.get((str(run_dir), name), ("", ""))[0] or f"ipc://{run_dir}/{name}.sock"


def node() -> str:
    """The node this process was placed on ("" : this machine, no cluster)."""
    return os.environ.get("OMNI_NODE", "")


def bind_to(run_dir: str | Path, name: str, ip: str = "") -> str:
    """What `name`'s mailbox binds: a free TCP port on `ip` (else $OMNI_BUS_HOST) if set, else its socket file."""
    ip = ip or os.environ.get("OMNI_BUS_HOST", "")
    return f"tcp://{ip}:*" if ip else f"ipc://{run_dir}/{name}.sock"


def learn(run_dir: str | Path, name: str, address: str, node: str) -> None:
    if address.startswith("tcp://"):
        _BOOK[str(run_dir), name] = (address, node)


def peers(run_dir: str | Path) -> dict[str, tuple[str, str]]:
    """Every (address, node) this process knows of `run_dir`'s actors."""
    return {key[1]: value for key, value in _BOOK.items() if key[0] == str(run_dir)}


def remote(run_dir: str | Path, name: str) -> bool:
    """Was `name` placed on another node than this process?"""
    where = _BOOK.get((str(run_dir), name), ("", ""))[1]
    return bool(where) and where != node()


def across(run_dir: str | Path, name: str, channel: str) -> str:
    """The payload channel to `name`: `channel` (the edge's on one host) or, on another node, the network's."""
    return "network" if remote(run_dir, name) else channel
