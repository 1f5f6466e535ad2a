"""Entry point of a stage process (`python -m omni.kernel.proc`, config as JSON on stdin).

A fresh interpreter per replica (spawn semantics): uvloop, one Actor, clean exit on any end.

The process watches its parent: if the kernel dies (even by SIGKILL) the actor shuts down,
which unlinks its shm arena and socket, so a crash of the parent leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import sys
from typing import Any

PR_SET_PDEATHSIG = 1


def _ask_for_parent_death_signal() -> None:
    """Linux: deliver SIGTERM to this process when its parent dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


async def _watch_parent(actor: Any, parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            logging.getLogger("omni.proc").warning("%s: parent %d is gone; shutting down", actor.name, parent_pid)
            actor.stop()
            return
        await asyncio.sleep(0.5)


async def _serve(config: dict[str, Any]) -> None:
    from omni.kernel.actor import Actor
    from omni.kernel.graph import Graph
    from omni.kernel.rundir import actor_name, remove_socket, shm_owner, unlink_shm_prefix

    graph = Graph.from_dict(config["graph"])
    actor = Actor(graph, config["stage"], config["replica"], config["run_dir"], config["instance"])
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, actor.stop)
    watcher = asyncio.create_task(_watch_parent(actor, config["parent_pid"]))
    try:
        await actor.run({"pid": os.getpid()})
    finally:
        watcher.cancel()
        unlink_shm_prefix(shm_owner(config["instance"], config["stage"], config["replica"]))
        remove_socket(config["run_dir"], actor_name(config["stage"], config["replica"]))
        if os.getppid() != config["parent_pid"]:  # the kernel crashed: tidy what it left
            remove_socket(config["run_dir"], "kernel")
            try:
                os.rmdir(config["run_dir"])  # the last actor out removes the directory
            except OSError:
                pass


def actor_main(config: dict[str, Any]) -> None:
    """Target of the stage process."""
    _ask_for_parent_death_signal()
    logging.basicConfig(
        level=config.get("log_level", "WARNING"),
        format=f"%(asctime)s {config['stage']}.{config['replica']} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for key, value in config.get("env", {}).items():
        os.environ[key] = value
    from omni.kernel.gpu_env import keep_multicast_off

    keep_multicast_off()  # also under an `env` of its own: NCCL, torch and NVSHMEM in this process and its children
    try:
        import uvloop

        uvloop.run(_serve(config))
    except ImportError:
        asyncio.run(_serve(config))
    os._exit(0)  # no atexit / resource-tracker surprises after a clean shutdown


if __name__ == "__main__":
    import json

    actor_main(json.loads(sys.stdin.read()))
