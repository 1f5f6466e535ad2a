"""Shared helpers of the kernel tests: a running demo kernel and small collectors."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from omni.kernel.kernel import Kernel
from omni.stages.demo import demo_graph


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
