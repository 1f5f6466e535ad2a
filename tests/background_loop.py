"""A server fixture's own event loop on a daemon thread, so sync tests (requests, openai) can call it."""

from __future__ import annotations

import asyncio
import threading


class BackgroundLoop:
    """`with Sub(...) as srv:` runs `Sub._start()` on a private loop; `srv.run(coro)` runs more there."""

    run_timeout = 60.0

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def run(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout or self.run_timeout)

    async def _start(self) -> None:
        raise NotImplementedError

    async def _stop(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.thread.start()
        self.run(self._start())
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.run(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()
