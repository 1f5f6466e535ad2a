"""torch.profiler over a window of a serving stage's steps, under real traffic (off unless
$OMNI_PROFILE_DIR is set: omni/env.py). The stage wraps each step in `with profiler.step():`;
after each `skip` count of steps (a window per load level) the next `steps` are profiled, then the
table of kernels by GPU time (and the steps' wall time) goes to `<dir>/<stage>.<skip>.txt` and a
chrome trace to `<dir>/<stage>.<skip>.json.gz`.
Kernels replayed from CUDA graphs are listed by name like eager ones."""

from __future__ import annotations

import contextlib
import gzip
import logging
import shutil
import time
from pathlib import Path

from omni.env import profile_settings

log = logging.getLogger("omni.profile")


class StepProfiler:
    def __init__(self, stage_name: str) -> None:
        settings = profile_settings()
        self.on = settings is not None and (not settings[1] or stage_name.split(".")[0] in settings[1]
                                            or stage_name in settings[1])
        self.name = stage_name
        if self.on:
            self.dir, _, self.windows, self.steps = settings
        self.count = 0
        self.start = 0
        self.prof = None
        self.wall = 0.0

    def step(self):
        if not self.on:
            return contextlib.nullcontext()
        return self._step()

    @contextlib.contextmanager
    def _step(self):
        self.count += 1
        if self.prof is None and self.windows and self.count == self.windows[0] + 1:
            self.start = self.windows.pop(0)
            self.wall = 0.0
            from torch.profiler import ProfilerActivity, profile

            self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.prof.__enter__()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.prof is not None:
                self.wall += time.perf_counter() - t0
                if self.count == self.start + self.steps:
                    self._write()

    def _write(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        prof, self.prof = self.prof, None
        self.on = bool(self.windows)
        prof.__exit__(None, None, None)
        out = Path(self.dir)
        out.mkdir(parents=True, exist_ok=True)
        by = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=by, row_limit=40, max_name_column_width=70)
        head = f"{self.name}: {self.steps} steps after {self.start}, wall {1e3 * self.wall / self.steps:.2f} ms a step\n"
        (out / f"{self.name}.{self.start}.txt").write_text(head + table)
        trace = out / f"{self.name}.{self.start}.json"
        prof.export_chrome_trace(str(trace))
        with open(trace, "rb") as src, gzip.open(str(trace) + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        trace.unlink()
        log.info("%s: profile of %d steps written to %s", self.name, self.steps, out)
