"""Shared helpers of the kernel tests: a running demo kernel and small collectors."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from omni.kernel.kernel import Kernel
from omni.kernel.stage import Emit, Stage
from omni.transport.arrays import split_rows
from omni.models.demo.stages import demo_graph


def graph(channel: str = "auto", **stage_args: dict[str, Any]):
    g = demo_graph(**stage_args)
    for edge in g.edges:
        if edge.dst != "$out":
            edge.channel = channel
    return g


def summarize(events) -> dict[str, Any]:
    """Text, token ids, concatenated audio and final data of one request's events."""
    text = "".join(e.data["text"] for e in events if e.port == "text")
    tokens = [t for e in events if e.port == "text" for t in e.data["token_ids"]]
    pcm = [e.data["pcm"] for e in events if e.port == "audio"]
    final = [e for e in events if e.final]
    return {
        "text": text,
        "tokens": tokens,
        "audio": np.concatenate(pcm) if pcm else np.zeros(0, np.float32),
        "final": final[0].data if final else None,
    }


def shm_segments(instance: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"omni-{instance}-")]


async def run_one(kernel: Kernel, prompt: str, max_tokens: int = 12, **extra: Any) -> dict[str, Any]:
    events = await kernel.submit({"prompt": prompt, "max_tokens": max_tokens, **extra}).collect()
    return summarize(events)


def unbatched(emits: list[Emit]) -> list[Emit]:
    """A stage's emits with each batched one (`rows`) split into its requests' own chunks, as the
    consumer's actor feeds them."""
    out: list[Emit] = []
    for e in emits:
        if e.rows is None:
            out.append(e)
            continue
        out += [Emit(rid, e.port, part) for rid, part, _ in split_rows("", e.rows, e.data)]
    return out


class ParamsProbe(Stage):
    """Tells what its Open held: the params keys and, per stage, the type of its sampling; the
    entry also opens the next stage (`next` port)."""

    def open(self, rid: str, params: dict[str, Any]) -> None:
        self.seen = {"stage": self.ctx.name, "keys": sorted(params),
                     "sampling": {k: type(v).__name__ for k, v in params.get("sampling", {}).items()}}
        self.rid = rid

    def close_input(self, rid: str) -> None:
        self.done = [Emit(rid, "seen", self.seen), Emit(rid, "next", {"go": 1}), Emit(rid, finish=True)]

    def has_work(self) -> bool:
        return bool(getattr(self, "done", None))

    def step(self) -> list[Emit]:
        done, self.done = self.done, []
        return done


def probe_graph(media: bool = False):
    """entry -> later, each telling what its Open held; `media`: later takes the media too."""
    from omni.kernel.graph import OUT, EdgeSpec, Graph, StageSpec

    return Graph("probe", [StageSpec("entry", "kernel_helpers:ParamsProbe"),
                           StageSpec("later", "kernel_helpers:ParamsProbe", media=media)],
                 [EdgeSpec("entry", "next", "later"), EdgeSpec("entry", "seen", OUT), EdgeSpec("later", "seen", OUT)],
                 media=["blob"])
