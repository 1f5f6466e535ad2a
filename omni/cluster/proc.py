"""Entry point of a stage process (`python -m omni.cluster.proc`, config as JSON on stdin).

A fresh interpreter per replica (spawn semantics): uvloop, one Actor, clean exit on any end. It lives
with the hosts that start it, on this machine (local.py) or on a Ray node (ray_host.py), not in the
kernel: the kernel only runs the Actor it builds; the process around it (parent watch, signals,
logging, environment, heap census) is the host's business.

The process watches its parent: if the kernel dies (even by SIGKILL) the actor shuts down,
which unlinks its shm arena and socket, so a crash of the parent leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import signal
import sys
from typing import Any

PR_SET_PDEATHSIG = 1


async def _serve(config: dict[str, Any]) -> None:
    # imported here, once the config's environment is set
    from omni.kernel.actor import Actor
    from omni.transport.channels import release_leftovers
    from omni.kernel.graph import Graph
    from omni.kernel.registry import STAGES
    from omni.kernel.rundir import KERNEL, remove_socket, shm_owner

    STAGES.add(config["stage_kinds"])  # what omnid's registry knows of this graph's kinds
    graph = Graph.from_dict(config["graph"])
    stage, replica, run_dir = config["stage"], config["replica"], config["run_dir"]
    actor = Actor(graph, stage, replica, run_dir, config["instance"])
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, actor, config["parent_pid"], sig)
    from omni.census import install_if_asked

    install_if_asked(loop, actor.name)  # a heap census at SIGUSR1 under $OMNI_CENSUS_DIR
    watcher = asyncio.create_task(_watch_parent(actor, config["parent_pid"]))
    try:
        await actor.run()
    finally:
        watcher.cancel()
        release_leftovers(graph, shm_owner(config["instance"], stage, replica))
        remove_socket(run_dir, actor.name)
        if os.getppid() != config["parent_pid"]:  # the kernel crashed: tidy what it left
            remove_socket(run_dir, KERNEL)
            try:
                os.rmdir(run_dir)  # the last actor out removes the directory
            except OSError:
                pass


def _on_signal(actor: Any, parent_pid: int, sig: signal.Signals) -> None:
    """A signal sent to the whole process group (systemd's default, Ctrl-C) is omnid's to act on:
    while omnid lives this stage keeps serving, so in-flight streams drain, and leaves when omnid
    says (ActorShutdown). With omnid gone (PR_SET_PDEATHSIG sends SIGTERM) it stops at once."""
    if os.getppid() != parent_pid:
        actor.stop()
    else:
        logging.getLogger("omni.proc").info("%s: %s deferred; omnid decides when this stage stops", actor.name,
                                            signal.Signals(sig).name)


async def _watch_parent(actor: Any, parent_pid: int) -> None:
    """Shut down once the kernel is gone (a SIGKILLed kernel sends nothing)."""
    while os.getppid() == parent_pid:
        await asyncio.sleep(0.5)
    logging.getLogger("omni.proc").warning("%s: parent %d is gone; shutting down", actor.name, parent_pid)
    actor.stop()


def main(config: dict[str, Any]) -> None:
    try:  # Linux: SIGTERM when the parent dies, at once (the watcher is the portable fallback)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    logging.basicConfig(level=config.get("log_level", "WARNING"), stream=sys.stderr,
                        format=f"%(asctime)s {config['stage']}.{config['replica']} %(levelname)s %(name)s: %(message)s")
    os.environ.update(config.get("env", {}))
    from omni.gpu_env import keep_multicast_off

    keep_multicast_off()  # also under an `env` of its own: NCCL, torch and NVSHMEM here and in its children
    try:
        from uvloop import run
    except ImportError:
        run = asyncio.run
    run(_serve(config))
    os._exit(0)  # no atexit / resource-tracker surprises after a clean shutdown


if __name__ == "__main__":
    main(json.loads(sys.stdin.read()))
