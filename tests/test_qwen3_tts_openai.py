"""Tiny Qwen3-TTS checkpoints (CustomVoice, VoiceDesign) as an OpenAI user meets them, no reference
package needed: not listed as a chat model (no gpt-4o aliases, chats false) and a chat request is
a clear 400; OpenAI's voice names speak on both kinds; an unknown voice is the one 400 of every
model; on a Base (cloning) model OpenAI's voice names need an upload first, and the 400 says so."""

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


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from omni.api.app import ServerConfig

    ckpt = str(make_tiny(tmp_path_factory.mktemp("base"), "base", "tiny-a", seed=0))
    config = ServerConfig(port=0, voice_dir=str(tmp_path_factory.mktemp("voices")))
    with LiveServer(mode="inline", config=config, build=lambda: build(ckpt)) as srv:
        srv.client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        yield srv


def test_a_cloning_model_says_openais_voice_needs_an_upload_then_speaks_in_it(base):
    """voice="alloy" on a Base (cloning) Qwen3-TTS, which has no built-in voices: the one 400
    `unknown_voice`, saying the model clones voices and naming the upload route; a clip uploaded
    with the SDK under the name "alloy" then is that voice (by name and by its id)."""
    import io

    import numpy as np
    import soundfile as sf

    assert not base.info.voices
    with pytest.raises(openai.BadRequestError) as refused:
        speak(base, voice="alloy")
    body = refused.value.body
    assert (body["code"], body["param"]) == ("unknown_voice", "voice")
    assert "clones voices and has no built-in voices" in body["message"]
    assert "POST /v1/audio/voices" in body["message"] and "name=alloy" in body["message"]
    t = np.arange(24000) / 24000
    clip = io.BytesIO()
    sf.write(clip, (0.3 * np.sin(2 * np.pi * (150 + 40 * np.sin(3 * t)) * t)).astype(np.float32), 24000,
             format="WAV", subtype="FLOAT")
    voice = base.client.audio.voices.create(name="alloy", consent="cons_x", extra_body={"ref_text": "Hello there."},
                                            audio_sample=("alloy.wav", clip.getvalue(), "audio/wav"))
    assert voice.name == "alloy"
    by_name = speak(base, voice="alloy")
    assert len(by_name) > 0 and by_name == speak(base, voice={"id": voice.id})
