"""The client side of a request: output events and the async iterator `Kernel.submit` returns.

It knows nothing of the kernel: a stream is handed the one thing it asks of it, how to cancel."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from omni.kernel.errors import OmniError


@dataclass
class OutputEvent:
    """One output of a request: a chunk from an exit port, or the final event."""

    rid: str
    stage: str
    port: str
    data: dict[str, Any]
    final: bool = False


@dataclass
class InflightRequest:
    """What the kernel tracks for one admitted request until its final event or error."""

    rid: str
    pending_exits: set[int]  # ids of the exit edges that have not ended
    holders: set[str]  # stages it uses that have not reported RequestLeft
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    final_meta: dict[str, Any] = field(default_factory=dict)
    deadline_handle: asyncio.TimerHandle | None = None

    def end(self, error: OmniError | None) -> None:
        """Queue the request's last event: the final one, or the error that ended it."""
        if self.deadline_handle is not None:
            self.deadline_handle.cancel()
        self.queue.put_nowait(error or OutputEvent(self.rid, "", "final", self.final_meta, final=True))


class RequestStream:
    """Async iterator of a request's `OutputEvent`s; raises the typed error that ended it."""

    def __init__(self, request: InflightRequest, cancel: Callable[[str], Awaitable[None]]) -> None:
        self._request = request
        self._cancel = cancel
        self._done = False

    @property
    def rid(self) -> str:
        return self._request.rid

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> OutputEvent:
        if self._done:
            raise StopAsyncIteration
        item = await self._request.queue.get()
        self._done = isinstance(item, OmniError) or item.final
        if isinstance(item, OmniError):
            raise item
        return item

    async def cancel(self) -> None:
        await self._cancel(self.rid)

    async def collect(self) -> list[OutputEvent]:
        """Every event of the request (for tests and simple callers)."""
        return [event async for event in self]
