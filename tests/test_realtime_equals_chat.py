"""A 10-turn Realtime session (spoken and typed turns, one spoken turn longer than the tiny audio
encoder's 4 s window, so it is partly encoded while appended) answers, turn by turn, what the same
conversation sent as chat requests answers (greedy) on a server with every cache off: the reuse of
earlier turns (audio encoder cache, thinker prefix cache, answers as generated ids, streamed
encoding) changes no output."""

from __future__ import annotations

import asyncio
import base64
import io

import numpy as np
import openai
import pytest
import soundfile as sf

from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.graph import build
from omni.models.qwen3_omni.request import chat_messages
from qwen3_fixtures import THREADS_ENV
from test_api_qwen3 import QwenServer
from test_api_support import LiveServer
from test_realtime_audio_reuse import counters, record_params

pytest.importorskip("websockets")

THINKER = {"thinker": {"max_tokens": 10, "temperature": 0}}
TURNS = 10
APPENDED = 5  # this turn is appended in 100 ms pieces and committed: 5.2 s, one window streamed


def clip(turn: int, seconds: float) -> np.ndarray:
    wave = np.random.default_rng(turn).standard_normal(int(seconds * 24000)) * 0.1
    return (np.clip(wave, -1, 1) * 32767).astype("<i2")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(make_tiny(tmp_path_factory.mktemp("tiny-equals-chat"), seed=1))


async def realtime_session(server) -> list[str]:
    client = openai.AsyncOpenAI(api_key="unused", base_url=server.url + "/v1", max_retries=0,
                                websocket_base_url=server.url.replace("http://", "ws://") + "/v1")
    answers = []
    async with client.beta.realtime.connect(model=server.info.id) as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(session={"modalities": ["text"], "stage_sampling": THINKER, "turn_detection": None,
                                           "instructions": "Answer briefly."})
        async for event in conn:
            if event.type == "session.updated":
                break
        for turn in range(TURNS):
            if turn == APPENDED:
                data = clip(turn, 5.2).tobytes()
                for i in range(0, len(data), 4800):
                    await conn.input_audio_buffer.append(audio=base64.b64encode(data[i:i + 4800]).decode())
                await conn.input_audio_buffer.commit()
            elif turn % 2 == 0:
                audio = base64.b64encode(clip(turn, 0.6 + 0.3 * turn).tobytes()).decode()
                await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                          "content": [{"type": "input_audio", "audio": audio}]})
            else:
                await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": f"Turn {turn}: and then what happened?"}]})
            await conn.response.create()
            text = []
            async for event in conn:
                assert event.type != "error", event.error
                if event.type == "response.text.delta":
                    text.append(event.delta)
                if event.type == "response.done":
                    assert event.response.status in ("completed", "incomplete")
                    break
            answers.append("".join(text))
    return answers


def wav(pcm_bytes: bytes, rate: int) -> str:
    buf = io.BytesIO()
    sf.write(buf, np.frombuffer(pcm_bytes, "<f4"), rate, format="WAV", subtype="FLOAT")
    return base64.b64encode(buf.getvalue()).decode()


def as_chat(messages: list[dict]) -> list[dict]:
    """The kernel's chat messages (what the session sent) as a client writes them."""
    out = []
    for m in messages:
        if isinstance(m["content"], str):
            out.append({k: m[k] for k in ("role", "content", "token_ids") if k in m})
            continue
        parts = []
        for p in m["content"]:
            if p["type"] == "text":
                parts.append({"type": "text", "text": p["text"]})
            else:
                parts.append({"type": "input_audio", "input_audio": {"data": wav(p["pcm"], p["sample_rate"]),
                                                                     "format": "wav"}})
        out.append({"role": m["role"], "content": parts})
    return out


def test_ten_realtime_turns_equal_the_same_conversation_as_chat_requests(ckpt):
    with QwenServer(ckpt) as server:
        seen = record_params(server)
        start = counters(server)
        answers = asyncio.run(asyncio.wait_for(realtime_session(server), 300))
        end = counters(server)
    turns = [p for p in seen if p.get("task") == "chat"]
    assert len(turns) == TURNS and any(p.get("task") == "encode" for p in seen)  # the long turn was streamed
    assert end["hits"] - start["hits"] > 0
    uncached = LiveServer(mode="process", env=THREADS_ENV, build=lambda: build(ckpt, stage_args={
        "thinker": {"enable_prefix_caching": False}, "audio_encoder": {"cache_size": 0}}))
    with uncached as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        for turn, params in enumerate(turns):
            messages = chat_messages(params)
            assert sum(m["role"] == "assistant" for m in messages) == turn
            assert all("token_ids" in m for m in messages if m["role"] == "assistant")
            reply = client.chat.completions.create(model=server.info.id, messages=as_chat(params["messages"]),
                                                   extra_body={"stage_sampling": THINKER})
            assert reply.choices[0].message.content == answers[turn], turn
