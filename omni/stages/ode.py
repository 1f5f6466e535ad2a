"""ODE solvers for flow-matching stages, as resumable state machines.

A solver never calls the model: it says where it needs the velocity next (`point`: time and state)
and takes it back (`advance`). That is what lets the diffusion stage batch the evaluations of many
requests, each at its own step and sub-step, into one forward. States are tensors (any array type
with + - * works); times are float32 0-d tensors, as the reference solver computes them.

`time_grid` is the reference's grid: `num_steps` points on [0, 1] (float32 linspace), warped by
sway sampling, t + s (cos(pi t / 2) - 1 + t), which with s < 0 spends more steps near t = 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol


def time_grid(num_steps: int, sway: float | None = None) -> Any:
    """float32 [num_steps] times from 0 to 1, sway-warped when `sway` is not None."""
    import torch

    t = torch.linspace(0, 1, num_steps, dtype=torch.float32)
    if sway is not None:
        t = t + sway * (torch.cos(math.pi / 2 * t) - 1 + t)
    return t


class Solver(Protocol):
    """One request's integration from `x0` over `times` (see RK4 for the shape of one)."""

    def point(self) -> tuple[Any, Any]:
        """(t, x) where the velocity is needed next."""
        ...

    def advance(self, v: Any) -> None:
        """The velocity at `point()`."""
        ...

    @property
    def done(self) -> bool: ...

    @property
    def value(self) -> Any:
        """The state at the last time (valid once done)."""
        ...

    @property
    def evals_left(self) -> int: ...


@dataclass
class _Grid:
    """A solver's state on its time grid: the current value and the interval it is in."""

    x: Any
    times: Any
    interval: int = 0

    @property
    def done(self) -> bool:
        return self.interval >= len(self.times) - 1

    @property
    def value(self) -> Any:
        return self.x

    def span(self) -> Any:
        """The current interval's length h."""
        return self.times[self.interval + 1] - self.times[self.interval]


@dataclass
class RK4(_Grid):
    """The reference's fourth-order Runge-Kutta (the 3/8 rule), four evaluations per interval:
    k1 at (t0, y), k2 at t0 + h/3, k3 at t0 + 2h/3, k4 at t1; y += (k1 + 3 (k2 + k3) + k4) h / 8."""

    ks: list = field(default_factory=list)

    STAGES = 4

    @property
    def evals_left(self) -> int:
        return (len(self.times) - 1 - self.interval) * self.STAGES - len(self.ks)

    def point(self) -> tuple[Any, Any]:
        t0, t1 = self.times[self.interval], self.times[self.interval + 1]
        h, y, k = t1 - t0, self.x, self.ks
        if not k:
            return t0, y
        if len(k) == 1:
            return t0 + h * (1 / 3), y + h * k[0] * (1 / 3)
        if len(k) == 2:
            return t0 + h * (2 / 3), y + h * (k[1] - k[0] * (1 / 3))
        return t1, y + h * (k[0] - k[1] + k[2])

    def advance(self, v: Any) -> None:
        self.ks.append(v)
        if len(self.ks) < self.STAGES:
            return
        k1, k2, k3, k4 = self.ks
        self.x = self.x + (k1 + 3 * (k2 + k3) + k4) * self.span() / 8
        self.ks, self.interval = [], self.interval + 1


@dataclass
class Euler(_Grid):
    """First order, one evaluation per interval: y += h v(t0, y)."""

    @property
    def evals_left(self) -> int:
        return len(self.times) - 1 - self.interval

    def point(self) -> tuple[Any, Any]:
        return self.times[self.interval], self.x

    def advance(self, v: Any) -> None:
        self.x = self.x + self.span() * v
        self.interval += 1


SOLVERS = {"rk4": RK4, "euler": Euler}


def make_solver(name: str, x0: Any, times: Any) -> Solver:
    try:
        return SOLVERS[name](x0, times)
    except KeyError:
        raise ValueError(f"unknown ODE solver {name!r}; known: {sorted(SOLVERS)}") from None
