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
