"""ODE solvers for flow-matching stages, over a batch of rows that each sit at their own sub-step.

A solver never calls the model. For every row it says where the velocity is needed (`points`: the
state; `time`: the time, on the host) and folds the velocity back in (`update`, at an interval's
last stage). Rows of many requests, each at its own interval and sub-step, thus share one forward,
and a whole step (points, forward, guidance, update) is fixed-shape tensor work that a CUDA graph
can record (omni/stages/diffusion_batch.py). Each row computes exactly what the reference's solver
computes for it alone: the same expressions in the same order, every candidate point formed and
the row's own one picked.

`time_grid` is the reference's grid: `num_steps` points on [0, 1] (float32 linspace), warped by
sway sampling, t + s (cos(pi t / 2) - 1 + t), which with s < 0 spends more steps near t = 0.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def time_grid(num_steps: int, sway: float | None = None) -> np.ndarray:
    """float32 [num_steps] times from 0 to 1, sway-warped when `sway` is not None (computed by torch
    on the CPU, as the reference does)."""
    import torch

    t = torch.linspace(0, 1, num_steps, dtype=torch.float32)
    if sway is not None:
        t = t + sway * (torch.cos(math.pi / 2 * t) - 1 + t)
    return t.numpy()


def _pick(candidates: list[Any], stage: Any) -> Any:
    """Row r of candidates[stage[r]]."""
    import torch

    return torch.stack(candidates)[stage, torch.arange(stage.shape[0], device=stage.device)]


class RK4:
    """The reference's fourth-order Runge-Kutta (the 3/8 rule), four evaluations per interval:
    k1 at (t0, y), k2 at t0 + h/3, k3 at t0 + 2h/3, k4 at t1; y += (k1 + 3 (k2 + k3) + k4) h / 8."""

    name = "rk4"
    stages = 4

    @staticmethod
    def time(t0: np.float32, t1: np.float32, stage: int) -> np.float32:
        h = t1 - t0
        return (t0, t0 + h * np.float32(1 / 3), t0 + h * np.float32(2 / 3), t1)[stage]

    @staticmethod
    def points(y: Any, ks: Any, h: Any, stage: Any) -> Any:
        """y [R, ...], ks [4, R, ...] (this interval's velocities so far), h [R, 1, ...], stage [R] long."""
        k1, k2, k3 = ks[0], ks[1], ks[2]
        return _pick([y, y + h * k1 * (1 / 3), y + h * (k2 - k1 * (1 / 3)), y + h * (k1 - k2 + k3)], stage)

    @staticmethod
    def update(y: Any, ks: Any, h: Any) -> Any:
        k1, k2, k3, k4 = ks[0], ks[1], ks[2], ks[3]
        return y + (k1 + 3 * (k2 + k3) + k4) * h / 8


class Euler:
    """First order, one evaluation per interval: y += h v(t0, y)."""

    name = "euler"
    stages = 1

    @staticmethod
    def time(t0: np.float32, t1: np.float32, stage: int) -> np.float32:
        return t0

    @staticmethod
    def points(y: Any, ks: Any, h: Any, stage: Any) -> Any:
        return y

    @staticmethod
    def update(y: Any, ks: Any, h: Any) -> Any:
        return y + h * ks[0]


SOLVERS = {s.name: s for s in (RK4, Euler)}


def solver_named(name: str) -> type:
    try:
        return SOLVERS[name]
    except KeyError:
        raise ValueError(f"unknown ODE solver {name!r}; known: {sorted(SOLVERS)}") from None


class Progress:
    """One row's place on its grid: the interval and the stage in it (host counters, no tensors)."""

    def __init__(self, solver: type, times: np.ndarray) -> None:
        self.solver, self.times = solver, times
        self.interval = 0
        self.stage = 0

    @property
    def done(self) -> bool:
        return self.interval >= len(self.times) - 1

    @property
    def evals_left(self) -> int:
        return (len(self.times) - 1 - self.interval) * self.solver.stages - self.stage

    def now(self) -> tuple[np.float32, np.float32, int]:
        """(t, h, stage) of the next evaluation."""
        t0, t1 = self.times[self.interval], self.times[self.interval + 1]
        return self.solver.time(t0, t1, self.stage), t1 - t0, self.stage

    def advance(self) -> None:
        self.stage += 1
        if self.stage == self.solver.stages:
            self.stage, self.interval = 0, self.interval + 1
