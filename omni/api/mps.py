"""CUDA MPS for the GPU stages omnid places on one device, so their kernels run side by side.

Without MPS, stage processes on one GPU time-slice it: the talker's small launch-bound kernels
wait for the thinker's time slice and the other way round. omnid starts its own MPS control
daemon (pipe and log directories of its own, so it never touches a system-wide daemon), exports
its pipe directory to the stage processes it spawns, and quits the daemon on exit.

`--mps auto` (the default) starts it when two or more stages share a CUDA device and
`nvidia-cuda-mps-control` is on PATH; `on` requires it; `off` never starts it.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections import Counter

log = logging.getLogger("omni.mps")
CONTROL = "nvidia-cuda-mps-control"
MODES = ("auto", "on", "off")


class MPSError(RuntimeError):
    """MPS was required (`--mps on`) and could not be started."""


def shared_devices(devices: list[str]) -> list[str]:
    """CUDA devices that two or more stages are placed on ("cuda" counts as "cuda:0")."""
    norm = [("cuda:0" if d == "cuda" else d) for d in devices if d and d.startswith("cuda")]
    return sorted(d for d, n in Counter(norm).items() if n > 1)


class MPSDaemon:
    """One MPS control daemon owned by this omnid; `stop` quits it and removes its directories."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(root, "pipe"),
                    "CUDA_MPS_LOG_DIRECTORY": os.path.join(root, "log")}
        self._saved: dict[str, str | None] = {}

    def start(self) -> None:
        for path in self.env.values():
            os.makedirs(path, exist_ok=True)
        env = {**os.environ, **self.env}
        subprocess.run([CONTROL, "-d"], env=env, check=True, timeout=30, capture_output=True)
        for key, value in self.env.items():  # spawned stage processes inherit it
            self._saved[key] = os.environ.get(key)
            os.environ[key] = value

    def stop(self) -> None:
        env = {**os.environ, **self.env}
        try:
            subprocess.run([CONTROL], input=b"quit\n", env=env, timeout=30, capture_output=True)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("MPS daemon did not quit cleanly: %s", exc)
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(self.root, ignore_errors=True)


def start_mps(mode: str, devices: list[str]) -> MPSDaemon | None:
    """Start MPS as `mode` asks for stages on `devices`; None when it is not started."""
    if mode not in MODES:
        raise MPSError(f"--mps must be one of {MODES}, got {mode!r}")
    shared = shared_devices(devices)
    if mode == "off" or (mode == "auto" and not shared):
        return None
    if shutil.which(CONTROL) is None:
        if mode == "on":
            raise MPSError(f"--mps on: {CONTROL} is not on PATH")
        log.info("MPS: %s not found; GPU stages on %s time-slice the device", CONTROL, shared)
        return None
    daemon = MPSDaemon(tempfile.mkdtemp(prefix="omni-mps-"))
    try:
        daemon.start()
    except (OSError, subprocess.SubprocessError) as exc:
        shutil.rmtree(daemon.root, ignore_errors=True)
        if mode == "on":
            raise MPSError(f"--mps on: the MPS daemon did not start: {exc}") from None
        log.warning("MPS: the daemon did not start (%s); GPU stages time-slice the device", exc)
        return None
    log.info("MPS: daemon started for the stages on %s (pipes in %s)", shared or devices, daemon.root)
    return daemon
