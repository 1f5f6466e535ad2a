"""Qwen3-Omni (tiny, one process per stage): a stage's death fails only the requests it holds.
Killing the vision encoder during text chats, or preprocess while requests decode downstream in
the thinker and talker: they all complete, and new text chats are served while it restarts."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from omni.models.qwen3_omni.graph import build
from omni.models.qwen3_omni.make_tiny import make_tiny
from qwen3_fixtures import LoopThread, RunningKernel, params, prompts, summarize

pytest.importorskip("transformers")

TOKENS = 120


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    ckpt = str(make_tiny(tmp_path_factory.mktemp("faults"), seed=0, preset="tiny-a"))
    graph, _ = build(ckpt)
    loop = LoopThread()
    try:
        with RunningKernel(loop, graph) as kernel:
            yield kernel
    finally:
        loop.close()


def _chat(modalities=("text",), tokens: int = TOKENS) -> dict:
    return params(prompts()["text"], modalities=modalities, thinker_tokens=tokens, talker_tokens=tokens,
                  ignore_eos=True)


async def _until(predicate, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def _kill_during(running, stage: str, make, n: int = 3, left: str | None = None):
    """Start n requests, wait for each one's first output (and for it to leave `left`), SIGKILL
    `stage`, serve one more text chat while it restarts; return every result."""
    kernel = running.kernel

    async def main():
        streams = [kernel.submit(make()) for _ in range(n)]
        firsts = [await s.__anext__() for s in streams]
        if left:
            await _until(lambda: all(left not in kernel._inflight[s.rid].holders for s in streams))
        os.kill(kernel.pid_of(stage), signal.SIGKILL)
        await _until(lambda: kernel.health()[stage] != "up")
        during = None
        if stage != "preprocess":  # a text chat needs preprocess; it skips the vision encoder
            during = summarize(await kernel.submit(_chat(tokens=4)).collect())
        done = [summarize([f, *await s.collect()]) for f, s in zip(firsts, streams)]
        await _until(lambda: kernel.health()[stage] == "up")
        after = summarize(await kernel.submit(_chat(tokens=4)).collect())
        return done, during, after

    return running.loop.run(main(), timeout=180)


def test_killing_the_vision_encoder_spares_text_chats(running):
    done, during, after = _kill_during(running, "vision_encoder", _chat)
    assert [len(r.tokens) for r in done] == [TOKENS] * 3
    assert len(during.tokens) == 4 and len(after.tokens) == 4


def test_killing_preprocess_spares_requests_decoding_downstream(running):
    done, _, after = _kill_during(running, "preprocess", lambda: _chat(("text", "audio"), 40), left="preprocess")
    assert [len(r.tokens) for r in done] == [40] * 3 and all(len(r.pcm) > 0 for r in done)
    assert len(after.tokens) == 4
