"""What the official `openai` client sends, unchanged, against omnid serving the demo (sync and
async clients, its realtime client): text completions and `n` choices by the one generation path,
/v1/embeddings refused in OpenAI's shape, OpenAI's voice and realtime model names, sized WAV,
the model's real answer length in Realtime, one error code per mistake."""

from __future__ import annotations

import asyncio
import io
import wave

import openai
import pytest
import requests

from omni.api.choices import choice_params
from omni.api.voice_names import OPENAI_VOICES
from omni.sampling import Sampling
from test_api_support import LiveServer

MODEL = "omni-demo"
HI = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def server():
    with LiveServer(mode="inline") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)


def aclient(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60,
                              websocket_base_url=server.url.replace("http://", "ws://") + "/v1")


def test_text_completion_runs_the_chat_generation_path(client):
    """The demo turns a chat's one message and a completion's prompt into the same input: the one
    path gives the same text, and `max_tokens` / `n` / `echo` / usage act as OpenAI's do."""
    chat = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=6)
    got = client.completions.create(model=MODEL, prompt="hello there", max_tokens=6)
    assert got.object == "text_completion" and got.choices[0].text == chat.choices[0].message.content
    assert got.choices[0].finish_reason == "length" and got.usage.completion_tokens == 6
    assert len(client.completions.create(model=MODEL, prompt="hello there").choices[0].text) == 16  # OpenAI's default
    many = client.completions.create(model=MODEL, prompt=["hello there", "other words"], n=2, max_tokens=3, echo=True)
    assert [c.index for c in many.choices] == [0, 1, 2, 3] and many.usage.completion_tokens == 12
    assert many.choices[0].text == many.choices[1].text == "hello there" + got.choices[0].text[:3]
    assert many.choices[2].text.startswith("other words")
    with pytest.raises(openai.BadRequestError, match="suffix") as refused:
        client.completions.create(model=MODEL, prompt="x", suffix="after")
    assert refused.value.body["param"] == "suffix"
    with pytest.raises(openai.BadRequestError, match="token ids"):
        client.completions.create(model=MODEL, prompt=[1, 2, 3])


def test_streamed_completion_and_chat_n_choices_by_index(server, client):
    whole = client.completions.create(model=MODEL, prompt="hello there", max_tokens=5).choices[0].text

    async def stream() -> tuple[dict, dict, object]:
        async with aclient(server) as ac:
            texts: dict[int, str] = {}
            async for chunk in await ac.completions.create(model=MODEL, prompt="hello there", max_tokens=5, n=2,
                                                           stream=True, stream_options={"include_usage": True}):
                for c in chunk.choices:
                    texts[c.index] = texts.get(c.index, "") + c.text
                usage = chunk.usage or None
            chats: dict[int, str] = {}
            async for chunk in await ac.chat.completions.create(model=MODEL, messages=HI, max_tokens=5, n=3,
                                                                stream=True):
                for c in chunk.choices:
                    chats[c.index] = chats.get(c.index, "") + (c.delta.content or "")
            return texts, chats, usage

    texts, chats, usage = asyncio.run(stream())
    assert texts == {0: whole, 1: whole} and usage.completion_tokens == 10
    assert chats == {0: whole, 1: whole, 2: whole}
    two = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=5, n=2)
    assert [c.index for c in two.choices] == [0, 1] and {c.message.content for c in two.choices} == {whole}
    assert two.usage.completion_tokens == 10


def test_each_choice_of_a_seeded_request_gets_its_own_seed():
    params = {"task": "chat", "sampling": {"thinker": Sampling(seed=7, temperature=1.0), "talker": Sampling()}}
    assert choice_params(params, 0, "thinker") is params
    second = choice_params(params, 2, "thinker")
    assert second["sampling"]["thinker"] == Sampling(seed=9, temperature=1.0) and params["sampling"]["thinker"].seed == 7


def test_a_stage_refusal_reaches_the_client_in_its_own_terms(client):
    """The demo's encoder refuses an empty prompt: the client reads its reason, not the kernel's
    "stage encoder: InvalidRequest: ..." wrapping."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt="")
    assert refused.value.body["message"] == "the demo model needs a non-empty text prompt"
    assert refused.value.body["code"] == "invalid_request"


def test_a_body_mistake_is_refused_in_openais_words_with_one_code(client):
    """What the SDK sends as written (it validates nothing): n=0, n past the limit, a missing field,
    each a 400 naming the field, with no msgspec phrasing and no stage name."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=HI, n=0)
    assert refused.value.body == {"message": "Invalid 'n': expected an integer >= 1, but got 0 instead.",
                                  "type": "invalid_request_error", "param": "n", "code": "invalid_value"}
    with pytest.raises(openai.BadRequestError, match="expected an integer <= 16, but got 17") as refused:
        client.completions.create(model=MODEL, prompt="hi", n=17)
    assert refused.value.body["param"] == "n"
    for call in (lambda: client.chat.completions.create(model=MODEL, messages=[{"content": "hi"}]),
                 lambda: client.audio.speech.create(model="tts-1", input="hi", voice=openai.NOT_GIVEN)):
        with pytest.raises(openai.BadRequestError) as refused:
            call()
        assert refused.value.body["code"] == "missing_field" and "Missing required parameter" in refused.value.message
    assert refused.value.body["param"] == "voice"
    listed = requests.post(str(client.base_url) + "chat/completions", data=b"[1, 2]", timeout=30,
                           headers={"Content-Type": "application/json"})
    assert listed.status_code == 400 and listed.json()["error"]["code"] == "invalid_type"
    assert listed.json()["error"]["message"].startswith("Invalid type for the request body: expected a JSON object")


def test_embeddings_is_an_openai_shaped_refusal(client):
    with pytest.raises(openai.BadRequestError, match="embeddings are not supported") as refused:
        client.embeddings.create(model=MODEL, input="hello")
    assert refused.value.body["code"] == "model_not_supported"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input="hello")


def test_every_openai_voice_speaks_and_unknown_voices_share_one_code(client):
    for voice in OPENAI_VOICES:
        got = client.audio.speech.create(model="tts-1", voice=voice, input="hi", response_format="pcm", speed=1.0)
        assert got.content == client.audio.speech.create(model="tts-1", voice="tone", input="hi",
                                                         response_format="pcm").content, voice
    chat = client.chat.completions.create(model="gpt-4o-audio-preview", messages=HI, modalities=["text", "audio"],
                                          audio={"voice": "marin", "format": "wav"}, max_tokens=3)
    assert chat.choices[0].message.audio.data
    codes = set()
    for call in (lambda: client.audio.speech.create(model="tts-1", voice="nobody", input="hi"),
                 lambda: client.chat.completions.create(model=MODEL, messages=HI, modalities=["text", "audio"],
                                                        audio={"voice": "nobody", "format": "wav"})):
        with pytest.raises(openai.BadRequestError) as refused:
            call()
        codes.add((refused.value.status_code, refused.value.body["code"]))
    assert codes == {(400, "unknown_voice")}


def test_speech_wav_carries_its_true_sizes(server, client):
    """Python's `wave` reads the clip's real length (a streamed header's 0xFFFFFFFF reads as 89,478 s)."""
    got = client.audio.speech.create(model="tts-1", voice="alloy", input="hello there", response_format="wav")
    with wave.open(io.BytesIO(got.content)) as w:
        seconds = w.getnframes() / w.getframerate()
        assert w.readframes(w.getnframes()) == got.content[44:]
    pcm = client.audio.speech.create(model="tts-1", voice="alloy", input="hello there", response_format="pcm").content
    assert seconds == len(pcm) / 2 / 24000 and 0 < seconds < 10
    streamed = requests.post(server.url + "/v1/audio/speech", timeout=30, json={
        "model": "tts-1", "voice": "alloy", "input": "hello there", "response_format": "wav", "stream": True})
    assert streamed.content[4:8] == b"\xff\xff\xff\xff" and streamed.content[44:] == got.content[44:]


@pytest.mark.parametrize("beta", [True, False])
@pytest.mark.parametrize("name", ["gpt-4o-realtime-preview", "gpt-realtime", "gpt-4o-mini-realtime-preview",
                                  "gpt-4o-realtime-preview-2024-12-17"])
def test_realtime_takes_openais_model_names_and_says_its_real_length(server, name, beta):
    pytest.importorskip("websockets")

    async def session():
        async with aclient(server) as ac:
            async with (ac.beta.realtime if beta else ac.realtime).connect(model=name) as conn:
                created = await conn.recv()
                await conn.session.update(session={"max_response_output_tokens": "inf"} if beta
                                          else {"type": "realtime", "max_output_tokens": "inf"})
                updated = await conn.recv()
                return created, updated

    created, updated = asyncio.run(asyncio.wait_for(session(), 60))
    assert created.type == "session.created" and created.session.model == name
    key = "max_response_output_tokens" if beta else "max_output_tokens"
    for event in (created, updated):  # the demo stops at 16 tokens unless asked for fewer
        assert getattr(event.session, key) == 16, event


def test_realtime_refuses_an_unknown_model_at_the_handshake(server):
    with pytest.raises(Exception) as refused:
        asyncio.run(_connect(server, "gpt-5-realtime-nonsense"))
    assert "404" in str(refused.value)


async def _connect(server, name: str) -> None:
    async with aclient(server) as ac:
        async with ac.realtime.connect(model=name) as conn:
            await conn.recv()
