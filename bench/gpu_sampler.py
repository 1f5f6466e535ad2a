"""The GPU's own utilisation beside the stage clocks: `nvidia-smi` sampled while a level runs.

`utilization.gpu` is the share of each sample period in which some kernel ran (any process), so
it shows GPU idle time that no stage clock can see; absent where there is no nvidia-smi.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
from typing import Any


class GpuSampler:
    """`start()` runs `nvidia-smi -lms PERIOD` in the background; `stop()` ends it and summarises
    per GPU (None without nvidia-smi or samples)."""

    def __init__(self, period_ms: int = 200) -> None:
        self.period_ms = period_ms
        self.samples: list[tuple[int, float, float]] = []  # (gpu index, utilisation %, memory used MiB)
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> "GpuSampler":
        if shutil.which("nvidia-smi") is None:
            return self
        cmd = ["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits",
               "-lms", str(self.period_ms)]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                index, util, mem = (float(x) for x in line.split(","))
            except ValueError:  # "[N/A]" or a partial line
                continue
            self.samples.append((int(index), util, mem))

    def stop(self) -> dict[str, Any] | None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._reader.join(timeout=5)
        return summarize(self.samples)


def summarize(samples: list[tuple[int, float, float]]) -> dict[str, Any] | None:
    """Per GPU: samples, utilisation mean / p50 / max (%), most memory used (MiB)."""
    if not samples:
        return None
    out: dict[str, Any] = {}
    for gpu in sorted({s[0] for s in samples}):
        util = [s[1] for s in samples if s[0] == gpu]
        out[f"gpu{gpu}"] = {"samples": len(util), "util_mean": round(statistics.fmean(util), 1),
                            "util_p50": statistics.median(util), "util_max": max(util),
                            "mem_used_max_mib": max(s[2] for s in samples if s[0] == gpu)}
    return out
