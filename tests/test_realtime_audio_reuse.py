"""A spoken conversation encodes each clip once: every turn re-sends the whole conversation, and
turn N's audio encoder work is its new clip only (the encoder stage's `encoded` counter), while the
thinker's prefill of turn N computes only what turn N-1 left out of its prefix cache (its prompt and
answer in full blocks, earlier audio rows included)."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import openai
import pytest

from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.request import chat_messages
from omni.models.qwen3_omni.stages.preprocess import Preprocessor
from test_api_qwen3 import QwenServer
from test_realtime_reuse import record_params

pytest.importorskip("websockets")

THINKER = {"thinker": {"max_tokens": 12, "temperature": 0}}
# 24 kHz samples per turn: growing (a later clip is the longest) and no multiple of the hop at 16 kHz,
# the two things that made the processor's padding change an earlier clip's rows
CLIPS = (13_001, 25_337, 37_501, 49_999)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(make_tiny(tmp_path_factory.mktemp("tiny-audio-reuse"), seed=1))


@pytest.fixture(scope="module")
def server(ckpt):
    with QwenServer(ckpt) as srv:
        yield srv


def pcm16(n: int, seed: int) -> str:
    wave = np.random.default_rng(seed).standard_normal(n) * 0.1
    return base64.b64encode((np.clip(wave, -1, 1) * 32767).astype("<i2").tobytes()).decode()


def stage_stats(server) -> dict[str, dict]:
    return {name.split("#")[0].split(".")[0]: s for name, s in server.run(server.kernel.stats()).items()}


def counters(server) -> dict:
    stats = stage_stats(server)
    audio = next(s for n, s in stats.items() if n.startswith("audio_encoder"))
    thinker = next(s for n, s in stats.items() if n.startswith("thinker"))
    return {"encoded": audio["encoded"], "hits": thinker["prefix_cache_hit_tokens"],
            "queried": thinker["prefix_cache_queried_tokens"], "block": thinker["block_size"]}


async def spoken_turn(conn, audio: str):
    await conn.conversation.item.create(item={"type": "message", "role": "user",
                                              "content": [{"type": "input_audio", "audio": audio}]})
    await conn.response.create()
    async for event in conn:
        assert event.type != "error", event.error
        if event.type == "response.done":
            return event.response


def test_each_turn_encodes_only_its_new_clip_and_prefills_only_its_new_tokens(server, ckpt):
    seen = record_params(server)
    client = openai.AsyncOpenAI(api_key="unused", base_url=server.url + "/v1", max_retries=0,
                                websocket_base_url=server.url.replace("http://", "ws://") + "/v1")
    marks = [counters(server)]

    async def go():
        async with client.beta.realtime.connect(model=server.info.id) as conn:
            assert (await conn.recv()).type == "session.created"
            await conn.session.update(session={"modalities": ["text"], "stage_sampling": THINKER,
                                               "turn_detection": None})
            async for event in conn:
                if event.type == "session.updated":
                    break
            for i, n in enumerate(CLIPS):
                done = await spoken_turn(conn, pcm16(n, i))
                assert done.status in ("completed", "incomplete")
                marks.append(counters(server))

    asyncio.run(asyncio.wait_for(go(), 180))
    pre = Preprocessor(ckpt)
    prompts = [pre(chat_messages(p)).input_ids.tolist() for p in seen[-len(CLIPS):]]
    block = marks[0]["block"]
    for turn in range(1, len(CLIPS) + 1):
        before, after = marks[turn - 1], marks[turn]
        assert after["encoded"] - before["encoded"] == 1, (turn, marks)  # the new clip, never the earlier ones
        if turn == 1:
            continue
        messages = chat_messages(seen[-len(CLIPS) + turn - 1])
        answer = [m for m in messages if m["role"] == "assistant"][-1]["token_ids"]
        prev, now = prompts[turn - 2], prompts[turn - 1]
        assert now[:len(prev) + len(answer)] == prev + answer
        reusable = (len(prev) + len(answer) - 1) // block * block
        hits = after["hits"] - before["hits"]
        computed = (after["queried"] - before["queried"]) - hits
        assert hits >= reusable, (turn, hits, reusable, marks)
        assert computed <= len(now) - reusable, (turn, computed, len(now), reusable)
