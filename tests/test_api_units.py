"""Pieces of the API without a server: stop strings, audio codecs, media decoding, request params."""

from __future__ import annotations

import asyncio
import base64
import io
import wave

import numpy as np
import pytest
import soundfile as sf

from omni.api.app import ServerConfig, ServerState
from omni.api.audio_codec import PCM16_RATE, StreamEncoder, encode_audio, to_pcm16
from omni.api.errors import ApiError
from omni.api.generation import StopMatcher
from omni.api.media import MediaLimits, decode_audio_bytes, parse_image_url
from omni.api.params import chat_params, speech_params
from omni.api.routes_audio import SpeedChanger
from omni.api.schemas import ChatCompletionRequest, SpeechRequest, decode_body
from omni.sampling import Sampling
from omni.models.registry import ModelInfo
from test_api_support import png_data_url, wav_bytes

RATE = 24000
TONE = (0.3 * np.sin(2 * np.pi * 440 * np.arange(RATE) / RATE)).astype(np.float32)


@pytest.mark.parametrize("stops,deltas,expect,stopped", [
    (["END"], ["ab", "cE", "N", "Dxyz"], "abc", True),
    (["END"], ["abE", "Nx"], "abENx", False),
    (["x", "yz"], ["aay", "zb"], "aa", True),
    ([], ["a", "b"], "ab", False),
    (["ab"], ["xa"], "xa", False),  # held back, flushed at the end
])
def test_stop_matcher(stops, deltas, expect, stopped):
    m = StopMatcher(stops)
    out = "".join(m.push(d) for d in deltas)
    if not m.stopped:
        out += m.flush()
    assert out == expect and m.stopped == stopped


@pytest.mark.parametrize("fmt", ["wav", "streamed-wav", "flac", "mp3", "opus"])
def test_streamed_encoding_decodes_like_whole(fmt):
    rate = 22050 if fmt == "opus" else RATE  # opus is re-rated to 48 kHz
    enc = StreamEncoder(fmt.removeprefix("streamed-"), rate, stream_wav=fmt == "streamed-wav")
    sizes, data = [], b""
    for i in range(0, RATE, 2400):
        piece = enc.feed(TONE[i:i + 2400])
        sizes.append(len(piece))
        data += piece
    data += enc.finish()
    pcm, out_rate = sf.read(io.BytesIO(data), dtype="float32")
    whole_bytes = encode_audio(TONE, rate, fmt.removeprefix("streamed-"))
    whole, _ = sf.read(io.BytesIO(whole_bytes), dtype="float32")
    if fmt in ("flac", "wav"):
        assert sum(sizes) == 0  # sent whole, with its length in the header
    if fmt == "wav":  # the very bytes of the whole file: true sizes, which Python's wave reads right
        assert data == whole_bytes and wave.open(io.BytesIO(data)).getnframes() == len(TONE)
    if fmt == "streamed-wav":
        assert data[4:8] == data[40:44] == b"\xff\xff\xff\xff" and data[44:] == whole_bytes[44:]
    if fmt in ("streamed-wav", "mp3"):
        assert sizes[0] > 0 and sum(1 for s in sizes if s) >= 5  # bytes leave as they are made
    expect = len(TONE) * out_rate // rate
    assert abs(len(pcm) - expect) <= 2500 and abs(len(whole) - expect) <= 2500
    if fmt in ("wav", "streamed-wav", "flac"):
        np.testing.assert_allclose(pcm, whole, atol=1e-4)
        np.testing.assert_allclose(pcm, TONE, atol=1e-4)


def test_pcm_is_24k_pcm16():
    half_rate = TONE[::2]
    out = encode_audio(half_rate, 12000, "pcm")
    assert len(out) == 2 * RATE
    assert to_pcm16(np.array([1.5, -1.5, 0.5], np.float32)) == np.array([32767, -32767, 16384], "<i2").tobytes()
    streamed = StreamEncoder("pcm16", 12000)
    data = b"".join(streamed.feed(half_rate[i:i + 1000]) for i in range(0, len(half_rate), 1000)) + streamed.finish()
    assert abs(len(data) // 2 - PCM16_RATE) < 50


def test_speed_changer_shortens_audio():
    changer = SpeedChanger(2.0, RATE)
    out = np.concatenate([changer.feed(TONE[i:i + 4000]) for i in range(0, RATE, 4000)] +
                         [changer.feed(np.zeros(0, np.float32), last=True)])
    assert abs(len(out) - RATE // 2) < 50


def test_audio_decoding_mixes_and_resamples():
    stereo = np.stack([TONE, -TONE * 0 + TONE], axis=1)
    buf = io.BytesIO()
    sf.write(buf, stereo, RATE, format="FLAC")
    pcm, rate = decode_audio_bytes(buf.getvalue(), "x", MediaLimits())
    assert rate == 16000 and pcm.dtype == np.float32 and abs(len(pcm) - 16000) <= 1
    with pytest.raises(ApiError) as err:
        decode_audio_bytes(wav_bytes(3.0), "x", MediaLimits(max_audio_seconds=1.0))
    assert err.value.status == 413
    mp3 = encode_audio(TONE, RATE, "mp3")
    pcm, _ = decode_audio_bytes(mp3, "x", MediaLimits())
    assert abs(len(pcm) - 16000) < 2000


def test_image_checks():
    limits = MediaLimits(max_image_pixels=100, image_hosts=["img.example.org"])
    data, url = parse_image_url(png_data_url(4), "p", limits)
    assert data[:4] == b"\x89PNG" and url is None
    with pytest.raises(ApiError) as err:
        parse_image_url(png_data_url(20), "p", limits)
    assert err.value.status == 413
    assert parse_image_url("https://IMG.example.org/a.png", "p", limits) == (None, "https://IMG.example.org/a.png")
    for bad in ("https://evil.example.com/a.png", "/etc/passwd", "file:///etc/passwd", "ftp://img.example.org/a"):
        with pytest.raises(ApiError):
            parse_image_url(bad, "p", limits)


def _state() -> ServerState:
    info = ModelInfo(id="m", family="f", speaks=True, voices=["Chelsie", "Ethan"], sampling_stage="thinker")
    return ServerState(kernel=None, info=info, stage_names=["thinker", "talker", "code2wav"], config=ServerConfig())


def test_chat_params_follow_the_kernel_contract():
    body = {
        "model": "m", "modalities": ["text", "audio"], "audio": {"voice": "ETHAN", "format": "wav"},
        "temperature": 0, "top_p": 0.9, "max_tokens": 7, "seed": 3,
        "stage_sampling": {"talker": {"temperature": 0.8, "top_k": 40}},
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "text", "text": "what is this"},
                {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_bytes(0.5)).decode(),
                                                        "format": "wav"}},
                {"type": "image_url", "image_url": {"url": png_data_url()}}]}],
    }
    req = decode_body(__import__("json").dumps(body).encode(), ChatCompletionRequest)
    params = asyncio.run(chat_params(_state(), req))
    assert params["task"] == "chat" and params["voice"] == "Ethan"
    assert params["modalities"] == ["text", "audio"]
    assert params["sampling"] == {"thinker": Sampling(temperature=0, top_p=0.9, max_tokens=7, seed=3),
                                  "talker": Sampling(temperature=0.8, top_k=40)}
    system, user = params["messages"]
    assert system == {"role": "system", "content": "be brief"}  # a string stays one: the template decides (chat_template)
    text, audio, image = user["content"]
    assert text == {"type": "text", "text": "what is this"}
    assert audio["type"] == "audio" and audio["sample_rate"] == 16000
    assert len(np.frombuffer(audio["pcm"], "<f4")) == 8000
    assert image["type"] == "image" and image["data"][:4] == b"\x89PNG"


def test_speech_params_and_voice_errors():
    req = decode_body(b'{"model": "m", "input": "hello", "voice": "chelsie", "speed": 1.5}', SpeechRequest)
    params = speech_params(_state(), req)
    assert params["task"] == "speech" and params["voice"] == "Chelsie" and params["input"] == "hello"
    assert params["speed"] == 1.0  # the API applies speed itself
    bad = decode_body(b'{"model": "m", "input": "hello", "voice": "nobody"}', SpeechRequest)
    with pytest.raises(ApiError, match="Chelsie, Ethan") as err:
        speech_params(_state(), bad)
    assert err.value.status == 400 and err.value.param == "voice" and err.value.code == "unknown_voice"


@pytest.mark.parametrize("voice, speaker", [("alloy", "Chelsie"), ("ASH", "Ethan"), ("shimmer", "Chelsie"),
                                            ("onyx", "Ethan"), ("verse", "Chelsie")])
def test_openai_voices_map_to_the_models_own_by_one_table(voice, speaker):
    """Each OpenAI name stands for the first speaker of its row the model has, else its default
    voice (verse's row names no speaker of this model: its first, Chelsie)."""
    req = decode_body(b'{"model": "m", "input": "hi", "voice": "%s"}' % voice.encode(), SpeechRequest)
    assert speech_params(_state(), req)["voice"] == speaker


def test_a_checkpoint_overrides_the_voice_table_and_voice_design_describes_the_voice(tmp_path):
    from omni.api.voice_names import voice_description
    from omni.layers.openai_voices import openai_voices

    (tmp_path / "config.json").write_text('{"omni_openai_voices": {"alloy": "ethan"}}')
    state = _state()
    state.info.openai_voices = openai_voices(tmp_path)
    req = decode_body(b'{"model": "m", "input": "hi", "voice": "alloy"}', SpeechRequest)
    assert speech_params(state, req)["voice"] == "Ethan"
    state.info.voices, state.info.designs_voices, state.info.instructions = [], True, True
    assert speech_params(state, req)["instructions"] == voice_description("alloy")  # none sent: the row's words
    told = decode_body(b'{"model": "m", "input": "hi", "voice": "alloy", "instructions": "a pirate"}', SpeechRequest)
    assert speech_params(state, told)["instructions"] == "a pirate"  # sent: they describe the voice
    with pytest.raises(ApiError, match="designs its voice") as err:  # never silently ignored
        speech_params(state, decode_body(b'{"model": "m", "input": "hi", "voice": "designed"}', SpeechRequest))
    assert err.value.code == "unknown_voice"
    (tmp_path / "config.json").write_text('{"omni_openai_voices": ["alloy"]}')
    with pytest.raises(ValueError, match="omni_openai_voices"):
        openai_voices(tmp_path)


def test_decode_body_names_the_field():
    with pytest.raises(ApiError) as err:
        decode_body(b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', ChatCompletionRequest)
    assert err.value.status == 400 and err.value.param == "messages[0].content"
