"""Starting, watching and restarting stage actors (one_for_one, with a restart budget).

A replica runs either as a spawned process or, in library mode, as an asyncio task in the
kernel's own loop; both report through the same messages. Death is seen by the exit
sentinel (process) or task completion, and a stalled mailbox by missing heartbeats.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omni.kernel.gpu_env import keep_multicast_off
from omni.kernel.graph import Graph
from omni.kernel.rundir import actor_name

log = logging.getLogger("omni.supervisor")


class ActorState(Enum):
    STARTING = "starting"
    UP = "up"
    RESTARTING = "restarting"
    DOWN = "down"
    STOPPED = "stopped"


@dataclass
class ActorHandle:
    stage: str
    replica: int
    state: ActorState = ActorState.STARTING
    process: subprocess.Popen | None = None
    task: asyncio.Task | None = None
    actor: Any = None  # library mode: the Actor object
    ready: asyncio.Future | None = None
    last_heartbeat: float = 0.0
    last_stats: dict[str, Any] = field(default_factory=dict)
    restarts: list[float] = field(default_factory=list)
    pid: int = 0

    @property
    def name(self) -> str:
        return actor_name(self.stage, self.replica)

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        if self.task is not None:
            return not self.task.done()
        return False

    def exit_reason(self) -> str:
        if self.process is not None:
            code = self.process.poll()
            if code is not None and code < 0:
                return f"killed by signal {-code}"
            return f"exited with code {code}"
        if self.task is not None and self.task.done() and not self.task.cancelled():
            exc = self.task.exception()
            return f"task ended: {exc!r}" if exc else "task ended"
        return "stopped"


class Launcher:
    """Starts one replica in the configured mode."""

    def __init__(self, graph: Graph, mode: str, run_dir: str, instance: str, log_level: str, env: dict[str, str]) -> None:
        if mode not in ("process", "inline"):
            raise ValueError(f"mode must be 'process' or 'inline', not {mode!r}")
        self.graph = graph
        self.mode = mode
        self.run_dir = run_dir
        self.instance = instance
        self.log_level = log_level
        self.env = env

    def launch(self, handle: ActorHandle) -> None:
        handle.ready = asyncio.get_running_loop().create_future()
        handle.state = ActorState.STARTING if not handle.restarts else ActorState.RESTARTING
        handle.last_heartbeat = time.monotonic()
        if self.mode == "process":
            config = {
                "graph": self.graph.to_dict(),
                "stage": handle.stage,
                "replica": handle.replica,
                "run_dir": self.run_dir,
                "instance": self.instance,
                "parent_pid": os.getpid(),
                "log_level": self.log_level,
                "env": self.env,
            }
            # A fresh interpreter (spawn semantics, never fork): CUDA-safe, and the caller's
            # __main__ is never re-imported, so scripts and notebooks need no main guard.
            env = keep_multicast_off(dict(os.environ))
            proc = subprocess.Popen([sys.executable, "-m", "omni.kernel.proc"], stdin=subprocess.PIPE, close_fds=True,
                                    env=env)
            proc.stdin.write(json.dumps(config).encode())
            proc.stdin.close()
            handle.process, handle.pid = proc, proc.pid
        else:
            from omni.kernel.actor import Actor

            keep_multicast_off()  # the stage runs in this process
            handle.actor = Actor(self.graph, handle.stage, handle.replica, self.run_dir, self.instance)
            handle.task = asyncio.create_task(handle.actor.run(), name=f"omni-{handle.name}")
            handle.pid = os.getpid()

    async def stop(self, handle: ActorHandle, timeout_s: float) -> None:
        """Wait for a replica told to shut down; then terminate, then kill."""
        handle.state = ActorState.STOPPED
        if handle.process is not None:
            proc = handle.process
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if proc.poll() is None:
                proc.terminate()
                await asyncio.sleep(0.2)
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=2.0)
        elif handle.task is not None:
            if handle.actor is not None:
                handle.actor.stop()
            try:
                await asyncio.wait_for(handle.task, timeout_s)
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):
                handle.task.cancel()

    def kill(self, handle: ActorHandle) -> None:
        if handle.process is not None and handle.process.poll() is None:
            handle.process.kill()
        if handle.task is not None:
            handle.task.cancel()


def restart_delay(handle: ActorHandle, window_s: float = 60.0) -> float:
    """Backoff before the next restart: 0.2 s, doubling per restart within the window."""
    now = time.monotonic()
    handle.restarts = [t for t in handle.restarts if now - t < window_s]
    return min(0.2 * (2 ** len(handle.restarts)), 5.0)
