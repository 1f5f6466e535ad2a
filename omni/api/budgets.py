"""Total memory budgets for what clients make omnid hold, one per resource and shared by every session
and connection: N clients together, not each alone, are bounded (32 Realtime sessions once took
omnid from 259 MB to 1.7 GB, each inside its own bound).

A holder takes a `Lease` on its resource's `Budget` and resizes it to what it holds. Growth past the
budget is refused with one OpenAI-shaped error (429, code `memory_budget_exceeded`) and changes
nothing; shrinking always succeeds; `settle` records what is already held and cannot be refused
(an answer's text once made). /metrics reports each budget's limit, use, peak and refusals.
"""

from __future__ import annotations

import os
import threading

from omni.api.errors import ApiError

# resource -> (what it holds, what a refused client can do)
RESOURCES = {
    "realtime_audio": ("Realtime input audio buffers", "commit or clear the input audio buffer, or retry later"),
    "conversation": ("Realtime conversations", "delete conversation items, or retry later"),
    "uploads": ("request bodies being received", "retry later"),
    "output": ("output queued for clients that have not read it", "read what was sent"),
    "voice_cache": ("uploaded voices", "delete voices"),
}
# the share of the machine's memory each budget gets by default (voice_cache: --voice-cache-mb, on disk)
DEFAULT_SHARES = {"realtime_audio": 1 / 16, "conversation": 1 / 16, "uploads": 1 / 8, "output": 1 / 32}


def machine_memory_bytes() -> int:
    """Physical memory of this machine (4 GiB where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return 4 << 30


def default_limits(memory_bytes: int | None = None) -> dict[str, int]:
    """Each memory budget's default: its share of the machine's memory."""
    memory = memory_bytes or machine_memory_bytes()
    return {name: int(memory * share) for name, share in DEFAULT_SHARES.items()}


class Budget:
    """The bytes one resource holds across every client; thread-safe (the VAD thread appends audio)."""

    def __init__(self, resource: str, limit_bytes: int) -> None:
        if resource not in RESOURCES:
            raise ValueError(f"unknown memory budget {resource!r}; known: {', '.join(RESOURCES)}")
        self.resource, self.limit = resource, int(limit_bytes)
        self.used = self.peak = self.refusals = 0
        self._lock = threading.Lock()

    def lease(self) -> Lease:
        return Lease(self)

    def _change(self, delta: int, refusable: bool) -> None:
        with self._lock:
            if refusable and delta > 0 and self.used + delta > self.limit:
                self.refusals += 1
                what, hint = RESOURCES[self.resource]
                err = ApiError(429, f"the server's memory budget for {what} ({_mib(self.limit)}, shared by every "
                               f"client) is spent: {_mib(self.used)} held, {_mib(delta)} more asked; {hint}",
                               code="memory_budget_exceeded", param=None)
                raise err
            self.used += delta
            self.peak = max(self.peak, self.used)


class Lease:
    """One holder's share of a budget (a session's buffer, a connection's queued output...)."""

    def __init__(self, budget: Budget) -> None:
        self.budget, self.bytes = budget, 0

    def resize(self, nbytes: int) -> None:
        """Hold `nbytes` from now on; growing past the budget raises its 429 and holds what it held."""
        self._set(nbytes, refusable=True)

    def settle(self, nbytes: int) -> None:
        """Hold `nbytes`, which are already held (never refused: they count against later growth)."""
        self._set(nbytes, refusable=False)

    def close(self) -> None:
        self._set(0, refusable=False)

    def _set(self, nbytes: int, refusable: bool) -> None:
        nbytes = max(0, int(nbytes))
        self.budget._change(nbytes - self.bytes, refusable)
        self.bytes = nbytes


class Budgets:
    """Every resource's budget of one server (`ServerState.budgets`)."""

    def __init__(self, limits: dict[str, int]) -> None:
        self.by_name = {name: Budget(name, limit) for name, limit in limits.items()}

    def __getitem__(self, resource: str) -> Budget:
        return self.by_name[resource]

    def __iter__(self):
        return iter(self.by_name.values())


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"
