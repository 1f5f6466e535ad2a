"""A Realtime conversation's next turn reuses the last: the answer goes back into the prompt as the
ids the thinker generated (a random-weight answer's text tokenizes into other ids), so turn 2's
prompt starts with turn 1's prompt + answer and the thinker's prefix cache serves that much."""

from __future__ import annotations

import asyncio

import openai
import pytest

from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.request import chat_messages
from omni.models.qwen3_omni.stages.preprocess import Preprocessor
from test_api_qwen3 import QwenServer

pytest.importorskip("websockets")

THINKER = {"thinker": {"max_tokens": 24, "temperature": 0}}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(make_tiny(tmp_path_factory.mktemp("tiny-reuse"), seed=1))


@pytest.fixture(scope="module")
def server(ckpt):
    with QwenServer(ckpt) as srv:
        yield srv


def record_params(server) -> list[dict]:
    """Every request's params as the kernel is given them."""
    seen, submit = [], server.kernel.submit

    def recording(params, *args, **kwargs):
        seen.append(params)
        return submit(params, *args, **kwargs)

    server.kernel.submit = recording
    return seen


def thinker_cache(server) -> dict:
    stats = next(s for name, s in server.run(server.kernel.stats()).items() if name.startswith("thinker"))
    return {k: stats[k] for k in ("prefix_cache_hit_tokens", "prefix_cache_queried_tokens", "block_size")}


async def turn(conn, text: str):
    await conn.conversation.item.create(item={"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": text}]})
    await conn.response.create()
    async for event in conn:
        assert event.type != "error", event.error
        if event.type == "response.done":
            return event.response


def test_turn_two_prompt_is_turn_one_prompt_plus_generated_ids_and_hits_the_cache(server, ckpt):
    seen = record_params(server)
    client = openai.AsyncOpenAI(api_key="unused", base_url=server.url + "/v1", max_retries=0,
                                websocket_base_url=server.url.replace("http://", "ws://") + "/v1")
    caches = []

    async def go():
        async with client.beta.realtime.connect(model=server.info.id) as conn:
            assert (await conn.recv()).type == "session.created"
            await conn.session.update(session={"modalities": ["text"], "stage_sampling": THINKER,
                                               "instructions": "Answer briefly."})
            async for event in conn:
                if event.type == "session.updated":
                    break
            first = await turn(conn, "Hello there, how are you today?")
            caches.append(thinker_cache(server))
            await turn(conn, "And what about tomorrow?")
            caches.append(thinker_cache(server))
            return first

    first = asyncio.run(asyncio.wait_for(go(), 120))
    pre = Preprocessor(ckpt)
    p1 = pre(chat_messages(seen[-2])).input_ids.tolist()
    messages2 = chat_messages(seen[-1])
    answer = next(m for m in messages2 if m["role"] == "assistant")
    generated = answer["token_ids"]
    assert len(generated) == first.usage.output_tokens > 0
    retokenized = pre.tokenizer(answer["content"], add_special_tokens=False)["input_ids"]
    assert retokenized != generated[:len(retokenized)] or len(retokenized) != len(generated), \
        "the answer round-trips: this conversation does not test the splice"
    p2 = pre(messages2).input_ids.tolist()
    assert p2[:len(p1) + len(generated)] == p1 + generated

    # turn 1 left the KV of its prompt and answer (but the last token) in full blocks; turn 2 hits them
    block = caches[0]["block_size"]
    reusable = (len(p1) + len(generated) - 1) // block * block
    hits = caches[1]["prefix_cache_hit_tokens"] - caches[0]["prefix_cache_hit_tokens"]
    assert reusable > len(p1) // block * block  # the answer adds blocks to reuse
    assert hits >= reusable, (hits, reusable, len(p1), len(generated), caches)


def test_every_answer_is_spliced_and_its_stop_token_not_written_twice(ckpt):
    pre = Preprocessor(ckpt)
    end = pre.tokenizer.convert_tokens_to_ids("<|im_end|>")
    stopped, cut = [0xe4, 0xbd, 65, end], [200, 201]  # an answer that stopped, one cut by max_tokens
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "token_ids": stopped},
                {"role": "user", "content": "and?"}, {"role": "assistant", "content": "y", "token_ids": cut},
                {"role": "user", "content": "ok"}]
    plain = [{k: v for k, v in m.items() if k != "token_ids"} for m in messages]
    ids = pre(chat_messages({"messages": messages})).input_ids.tolist()
    ref = pre(chat_messages({"messages": plain})).input_ids.tolist()
    x, y = (pre.tokenizer("x", add_special_tokens=False)["input_ids"],
            pre.tokenizer("y", add_special_tokens=False)["input_ids"])
    i, j = ref.index(x[0]), ref.index(y[0])
    assert ids == ref[:i] + stopped + ref[i + len(x) + 1:j] + cut + ref[j + len(y):]


def test_an_answer_holding_a_media_placeholder_id_is_spliced_without_it(ckpt):
    """A random-weight thinker can sample an input-only placeholder id (<|image_pad|> ...); the next
    turn splices that answer's ids: without them, else the prompt would ask for an image it does not
    carry (a Realtime turn was refused so: "the prompt has 1 image placeholders for 0 inputs")."""
    pre = Preprocessor(ckpt)
    media = [pre.audio_token_id, pre.image_token_id, pre.video_token_id]
    answer = [200, media[1], 201, media[0], media[2], 202]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "token_ids": answer},
                {"role": "user", "content": "and?"}]
    ids = pre(chat_messages({"messages": messages})).input_ids.tolist()
    clean = pre(chat_messages({"messages": [messages[0], {**messages[1], "token_ids": [200, 201, 202]},
                                            messages[2]]})).input_ids.tolist()
    assert ids == clean and not set(media) & set(ids)
