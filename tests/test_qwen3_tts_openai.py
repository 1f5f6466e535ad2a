"""Tiny Qwen3-TTS checkpoints (CustomVoice, VoiceDesign) as an OpenAI user meets them, no reference
package needed: not listed as a chat model (no gpt-4o aliases, chats false) and a chat request is
a clear 400; OpenAI's voice names speak on both kinds; an unknown voice is the one 400 of every
model."""

from __future__ import annotations

import openai
import pytest

from omni.models.qwen3_tts.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_tts.graph import build
from test_api_support import LiveServer

FEW = {"stage_sampling": {"talker": {"temperature": 0, "max_tokens": 3}}}


@pytest.fixture(scope="module", params=["custom-voice", "voice-design"])
def served(request, tmp_path_factory):
    ckpt = str(make_tiny(tmp_path_factory.mktemp(request.param), request.param, "tiny-a", seed=0))
    with LiveServer(mode="inline", build=lambda: build(ckpt)) as srv:
        srv.client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        srv.kind = request.param
        yield srv


def speak(srv, **fields) -> bytes:
    return srv.client.audio.speech.create(model="tts-1", input="hello", response_format="pcm", extra_body=FEW,
                                          **fields).content


def test_a_tts_model_is_not_a_chat_model(served):
    cards = {m.id: m.model_extra for m in served.client.models.list().data}
    assert cards[served.info.id]["chats"] is False and cards[served.info.id]["speaks"] is True
    assert not any(name.startswith("gpt-4o") and "tts" not in name for name in cards), sorted(cards)
    assert {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(cards)
    with pytest.raises(openai.BadRequestError, match="does not chat") as refused:
        served.client.chat.completions.create(model=served.info.id, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["code"] == "model_not_supported"
    with pytest.raises(openai.NotFoundError):  # gpt-4o names no model here
        served.client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])


def test_openai_voices_speak_and_unknown_ones_are_one_400(served):
    alloy = speak(served, voice="alloy")
    assert len(alloy) > 0
    if served.kind == "custom-voice":  # alloy's row: vivian first
        assert alloy == speak(served, voice="vivian") and speak(served, voice="onyx") == speak(served, voice="eric")
    else:  # no instructions: the voice's description is the instructions
        from omni.api.voice_names import voice_description

        assert alloy == speak(served, voice="onyx", instructions=voice_description("alloy"))
        assert alloy != speak(served, voice="onyx")
    with pytest.raises(openai.BadRequestError) as refused:
        speak(served, voice="nobody-here")
    body = refused.value.body
    assert body["code"] == "unknown_voice" and body["param"] == "voice" and "alloy" in body["message"]
