"""`n` choices (and a completion's several prompts): one KernelRequest each, run at once, their
pieces merged in arrival order with the choice index, so one SSE stream carries them all.

Choice i of a seeded request gets seed + i: the same request gives the same n choices, and they
differ from each other (one seed for all would make them equal copies).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import msgspec

from omni.api.generation import Collected, KernelRequest


def choice_params(params: dict, index: int, sampling_stage: str | None) -> dict:
    """Choice `index`'s params: the request's, its seed moved on by `index`."""
    if index == 0:
        return params
    out = copy.copy(params)
    out["sampling"] = {stage: fields if fields.seed is None else msgspec.structs.replace(fields, seed=fields.seed + index)
                       for stage, fields in params.get("sampling", {}).items()}
    return out


class Choices:
    """`async with Choices(gens) as c: async for index, piece in c.pieces(): ...`; leaving cancels
    every request still running (KernelRequest's own exit)."""

    def __init__(self, gens: list[KernelRequest]) -> None:
        self.gens = gens
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Choices:
        for gen in self.gens:
            await self._stack.enter_async_context(gen)
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._stack.aclose()

    async def pieces(self) -> AsyncIterator[tuple[int, object]]:
        """(choice index, piece) as they come; each choice ends with its Finish. The first error of
        any choice ends them all."""
        if len(self.gens) == 1:  # the common case: no tasks
            async for piece in self.gens[0].pieces():
                yield 0, piece
            return
        queue: asyncio.Queue = asyncio.Queue()
        done = object()

        async def pump(index: int, gen: KernelRequest) -> None:
            try:
                async for piece in gen.pieces():
                    await queue.put((index, piece))
            except BaseException as exc:  # handed to the reader, which raises it
                await queue.put((index, exc))
                return
            await queue.put((index, done))

        tasks = [asyncio.ensure_future(pump(i, gen)) for i, gen in enumerate(self.gens)]
        try:
            running = len(tasks)
            while running:
                index, item = await queue.get()
                if item is done:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield index, item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def collect(self) -> list[Collected]:
        """Every choice whole, in index order."""
        out = [Collected() for _ in self.gens]
        async for index, piece in self.pieces():
            out[index].add(piece)
        return out
