"""The default host: stage processes on this machine, as subprocesses of the kernel's process.

A host has `spawn(config, spec)`, which starts `python -m omni.cluster.proc` with `config` for one
replica of stage `spec` and returns a process handle (`pid`, `poll`, `reason`, `kill`, `stop`);
`bus_host` is the IP the kernel's own mailbox binds ("" = ipc:// socket files). The supervisor
decides when to start and restart; a host only runs what it is told (omni/cluster/ray_host.py does
the same on Ray nodes, omni/cluster/inline.py as asyncio tasks in the kernel's process).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from omni.gpu_env import keep_multicast_off


class LocalProcess:
    """One stage process here; what the supervisor asks of any host's process."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.pid = proc, proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def reason(self) -> str:
        code = self.proc.poll()
        return f"killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"

    def kill(self) -> None:
        """As a crash would: SIGKILL."""
        if self.proc.poll() is None:
            self.proc.kill()

    async def stop(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for it to leave (it was told to), then terminate, then kill."""
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.proc.poll() is None:
            self.proc.terminate()
            await asyncio.sleep(0.2)
        self.kill()
        self.proc.wait(timeout=2.0)


class LocalHost:
    """Stage processes on this machine; `bus_host` (an IP such as 127.0.0.1) runs the bus on TCP."""

    def __init__(self, bus_host: str = "") -> None:
        self.bus_host = bus_host

    def spawn(self, config: dict[str, Any], spec: Any) -> LocalProcess:
        if self.bus_host:
            config = {**config, "env": {"OMNI_BUS_HOST": self.bus_host, **config["env"]}}
        # A fresh interpreter (spawn semantics, never fork): CUDA-safe, and the caller's
        # __main__ is never re-imported, so scripts and notebooks need no main guard.
        proc = subprocess.Popen([sys.executable, "-m", "omni.cluster.proc"], stdin=subprocess.PIPE, close_fds=True,
                                env=keep_multicast_off(dict(os.environ)))
        proc.stdin.write(json.dumps(config).encode())
        proc.stdin.close()
        return LocalProcess(proc)
