"""Past the configured capacity of Realtime sessions a new one is refused with one OpenAI-shaped
`error` event and close code 1013, while the open sessions go on; a freed place is taken again."""

from __future__ import annotations

import asyncio

import openai
import pytest

from omni.api.state import ServerConfig
from test_api_support import LiveServer

pytest.importorskip("websockets")

CAPACITY = 2
ANSWERED = ("completed", "incomplete")  # the demo may stop at its max_tokens


@pytest.fixture(scope="module")
def server():
    with LiveServer(mode="inline", config=ServerConfig(port=0, max_realtime_sessions=CAPACITY)) as srv:
        yield srv


def connect(server):
    client = openai.AsyncOpenAI(api_key="unused", base_url=server.url + "/v1", max_retries=0,
                                websocket_base_url=server.url.replace("http://", "ws://") + "/v1")
    return client.beta.realtime.connect(model=server.info.id)


async def answer(conn) -> str:
    await conn.conversation.item.create(item={"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": "hi"}]})
    await conn.response.create(response={"modalities": ["text"]})
    async for event in conn:
        assert event.type != "error", event.error
        if event.type == "response.done":
            return event.response.status


def test_a_session_past_capacity_is_refused_and_the_open_ones_go_on(server):
    async def go():
        async with connect(server) as a, connect(server) as b:
            assert (await a.recv()).type == "session.created"
            assert (await b.recv()).type == "session.created"
            async with connect(server) as refused:
                event = await refused.recv()
                assert event.type == "error"
                assert (event.error.type, event.error.code) == ("rate_limit_error", "overloaded")
                assert f"capacity of {CAPACITY} Realtime sessions" in event.error.message
                with pytest.raises(Exception) as closed:  # then the socket closes: try again later
                    await refused.recv()
                assert "1013" in str(closed.value), closed.value
            assert await answer(a) in ANSWERED and await answer(b) in ANSWERED
        async with connect(server) as c:  # the places a and b held are free again
            assert (await c.recv()).type == "session.created"
            assert await answer(c) in ANSWERED

    asyncio.run(asyncio.wait_for(go(), 60))


TINY_CAPACITY, SESSIONS = 24, 32


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
    from omni.models.qwen3_omni.graph import build
    from qwen3_fixtures import THREADS_ENV

    ckpt = str(make_tiny(tmp_path_factory.mktemp("tiny-capacity"), seed=1))
    with LiveServer(mode="process", env=THREADS_ENV, build=lambda: build(ckpt),
                    config=ServerConfig(port=0, max_realtime_sessions=TINY_CAPACITY)) as srv:
        yield srv


async def spoken_then_typed(conn, seed: int) -> list[str]:
    import base64

    import numpy as np

    wave = np.random.default_rng(seed).standard_normal(24000) * 0.1
    audio = base64.b64encode((wave * 32767).astype("<i2").tobytes()).decode()
    statuses = []
    for content in ({"type": "input_audio", "audio": audio}, {"type": "input_text", "text": "and then?"}):
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [content]})
        await conn.response.create(response={"modalities": ["text"],
                                             "stage_sampling": {"thinker": {"max_tokens": 6, "temperature": 0}}})
        async for event in conn:
            assert event.type != "error", event.error
            if event.type == "response.done":
                statuses.append(event.response.status)
                break
    return statuses


def test_thirty_two_sessions_on_the_tiny_model_all_answer_or_are_refused_as_documented(tiny_server):
    opened = asyncio.Event()
    count = {"open": 0}

    async def one(i: int) -> str:
        async with connect(tiny_server) as conn:
            first = await conn.recv()
            if first.type == "error":
                assert (first.error.type, first.error.code) == ("rate_limit_error", "overloaded")
                assert f"capacity of {TINY_CAPACITY} Realtime sessions" in first.error.message
                return "refused"
            assert first.type == "session.created"
            count["open"] += 1
            if count["open"] == TINY_CAPACITY:
                opened.set()
            await opened.wait()  # every admitted session is open at once: the refusals are real
            assert all(s in ANSWERED for s in await spoken_then_typed(conn, i))
            return "answered"

    async def go():
        tasks = []
        for i in range(SESSIONS):
            tasks.append(asyncio.create_task(one(i)))
            await asyncio.sleep(0.02)
        return await asyncio.gather(*tasks)

    outcomes = asyncio.run(asyncio.wait_for(go(), 300))
    assert outcomes.count("answered") == TINY_CAPACITY and outcomes.count("refused") == SESSIONS - TINY_CAPACITY
