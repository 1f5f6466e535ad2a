"""Running the app: listen, wait for SIGINT / SIGTERM, drain in-flight requests (new ones get a 503
at once), end what is still streaming with a final event, stop the kernel.

`start_http` / `stop_http` are also what tests and notebooks use to serve an app on a free port.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from aiohttp import web

from omni.api.state import STATE
from omni.api.connections import GuardedRunner

log = logging.getLogger("omni.api")


def stop_reserve(drain_timeout_s: float) -> float:
    """Seconds of the drain timeout kept for ending the streams, closing connections and stopping
    the stages: the streams get a quarter to write their final events, aiohttp gives a handler
    still running its shutdown timeout twice (to finish, then once cancelled), a quarter each; the
    stages get the rest."""
    return min(3.0, 0.4 * drain_timeout_s)


class HttpServer:
    """An app listening on host:port (port 0 picks a free one)."""

    def __init__(self, app: web.Application, host: str, port: int) -> None:
        self.app, self.host, self.port = app, host, port
        self.runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> HttpServer:
        # handler_cancellation: a client that disconnects cancels its handler, so its request is
        # cancelled in the kernel even while nothing is being written to it
        config = self.app[STATE].config
        self.runner = GuardedRunner(self.app, config.header_timeout_s, stop_reserve(config.drain_timeout_s) / 4,
                                    handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port, reuse_address=True)
        await site.start()
        if self.runner.addresses:  # the port actually bound (port 0 asks for a free one)
            self.port = self.runner.addresses[0][1]
        return self

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests and wait for the in-flight ones; True when all finished in time."""
        state = self.app[STATE]
        state.draining = True
        if state.inflight:
            log.info("draining %d in-flight request(s) (up to %.0f s)", state.inflight, timeout_s)
        done = await state.wait_idle(timeout_s)
        if not done:
            log.warning("drain timed out with %d request(s) still in flight; they will be cut off",
                        state.inflight)
        return done

    async def end_streams(self, kernel, grace_s: float) -> None:
        """Past the drain: end every request still in flight with the shutdown's error, so each
        stream writes its final event (SSE: an error event, then `[DONE]`), and give the handlers
        `grace_s` to write it. Realtime sockets get theirs when the runner closes them."""
        state = self.app[STATE]
        if state.inflight:
            log.warning("ending %d request(s) still in flight with a shutdown error", state.inflight)
        kernel.end_requests("the server is shutting down")
        await state.wait_idle(grace_s)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


async def serve_until_signal(server: HttpServer, kernel, drain_timeout_s: float,
                             on_listening: Callable[[str], None] = print,
                             stop_event: asyncio.Event | None = None) -> None:
    """Serve until SIGINT/SIGTERM (or `stop_event`), then drain, end the streams, close HTTP, and stop
    the kernel. The stages ignore a SIGTERM sent to the whole process group (omni/cluster/proc.py): they
    serve through the drain and leave when the kernel stops them."""
    loop = asyncio.get_running_loop()
    stop = stop_event or asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():
            log.info("%s again: already shutting down", sig.name)
        stop.set()

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread: caller stops us
            pass
    if installed:  # omnid's own heap census at SIGUSR1 under $OMNI_CENSUS_DIR, as every stage's (omni/census.py)
        from omni.census import install_if_asked

        install_if_asked(loop, "omnid")
    try:
        await server.start()
        on_listening(f"omnid listening on {server.url}")
        await stop.wait()
        log.info("shutting down: draining requests, then stopping every stage")
        # the drain leaves time to end the streams, close connections and stop the stages inside
        # drain_timeout_s
        reserve = stop_reserve(drain_timeout_s)
        await server.drain(max(0.0, drain_timeout_s - reserve))
        await server.end_streams(kernel, reserve / 4)
    finally:
        await server.stop()
        await kernel.stop()
        for sig in installed:  # only now: a late second signal must not kill a half-stopped server
            loop.remove_signal_handler(sig)
        if installed:
            loop.remove_signal_handler(signal.SIGUSR1)
        log.info("omnid stopped")
