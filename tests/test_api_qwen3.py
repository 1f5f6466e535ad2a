"""omnid serving a tiny Qwen3-Omni (stages as processes) to the official `openai` client: greedy chat
audio, whole and streamed, speech and transcription equal transformers' `generate`. Plus the
`omnid make-tiny qwen3-omni` subcommand and the embedded default model."""

from __future__ import annotations

import base64
import io
import json
import os

import numpy as np
import openai
import pytest

from omni.models.qwen3_omni.graph import build
from omni.models.qwen3_omni.checkpoint.make_tiny import TINY_MARKER, make_tiny
from omni.models.qwen3_omni.request import SPEECH_INSTRUCTION, TRANSCRIBE_INSTRUCTION
from qwen3_fixtures import THREADS_ENV, Oracle, audio_part, png_bytes, tone_pcm
from test_api_cli import omnid
from test_api_support import LiveServer

pytest.importorskip("transformers")

THINKER, TALKER = 12, 40
GREEDY = {"stage_sampling": {"talker": {"temperature": 0, "max_tokens": TALKER}}}
PCM16_STEP = 1 / 32767  # omnid sends audio as 16-bit PCM: half a step of rounding on top of the model's error


def QwenServer(ckpt: str) -> LiveServer:
    return LiveServer(mode="process", env=THREADS_ENV, build=lambda: build(ckpt))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(make_tiny(tmp_path_factory.mktemp("tiny-b"), seed=1, preset="tiny-b"))


@pytest.fixture(scope="module")
def oracle(ckpt):
    return Oracle(ckpt)


@pytest.fixture(scope="module")
def server(ckpt):
    with QwenServer(ckpt) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def pcm16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767


def assert_close(got: np.ndarray, wav: np.ndarray) -> None:
    peak = float(np.abs(wav).max())
    assert got.shape == wav.shape and peak > 1e-3
    assert float(np.abs(got - wav).max()) <= 1e-4 * peak + PCM16_STEP / 2 + 1e-6


def test_models_and_voices(client, server, ckpt):
    model = client.models.retrieve(server.info.id)
    assert model.id == os.path.basename(ckpt)
    assert server.info.voices == ["ethan", "aiden", "chelsie"] and server.info.random_weights


def test_greedy_chat_audio_equals_transformers_whole_and_streamed(client, server, oracle):
    text = "hello there, how are you today?"
    ref = oracle.generate([{"role": "user", "content": text}], "chelsie", THINKER, TALKER)
    kwargs = dict(model=server.info.id, messages=[{"role": "user", "content": text}], modalities=["text", "audio"],
                  audio={"voice": "Chelsie", "format": "pcm16"}, temperature=0, max_tokens=THINKER, extra_body=GREEDY)
    whole = client.chat.completions.create(**kwargs)
    message = whole.choices[0].message
    assert message.content == ref.text and whole.usage.completion_tokens == len(ref.tokens)
    assert_close(pcm16(base64.b64decode(message.audio.data)), ref.wav)
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    pieces = [c.choices[0].delta.audio for c in chunks if c.choices and c.choices[0].delta.audio]
    data = [base64.b64decode(p.data) for p in pieces if p.data]
    assert len(data) > 1  # streamed as made
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.text
    assert_close(pcm16(b"".join(data)), ref.wav)


def test_image_input_chat_audio_equals_transformers(client, server, oracle):
    png = png_bytes(48, 40, 5)
    ref = oracle.generate([{"role": "user", "content": [{"type": "image", "data": png},
                                                        {"type": "text", "text": "what is it?"}]}],
                          "ethan", THINKER, TALKER)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    resp = client.chat.completions.create(
        model=server.info.id, modalities=["text", "audio"], audio={"voice": "ethan", "format": "pcm16"},
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                               {"type": "text", "text": "what is it?"}]}],
        temperature=0, max_tokens=THINKER, extra_body=GREEDY)
    assert resp.choices[0].message.content == ref.text
    assert_close(pcm16(base64.b64decode(resp.choices[0].message.audio.data)), ref.wav)


def test_speech_route_equals_transformers(client, server, oracle):
    words = "omni speaks"
    ref = oracle.generate([{"role": "user", "content": SPEECH_INSTRUCTION + words}], "aiden", THINKER, TALKER)
    body = {"stage_sampling": {"thinker": {"temperature": 0, "max_tokens": THINKER}, **GREEDY["stage_sampling"]}}
    speech = client.audio.speech.create(model=server.info.id, voice="aiden", input=words, response_format="pcm",
                                        extra_body=body)
    assert_close(pcm16(speech.content), ref.wav)


def test_transcription_equals_transformers(client, server, oracle):
    import soundfile as sf

    pcm = tone_pcm(0.9, 7)
    buf = io.BytesIO()
    sf.write(buf, pcm, 16000, format="WAV", subtype="FLOAT")  # lossless: both sides see the same samples
    ref = oracle.generate([{"role": "user", "content": [audio_part(pcm), {"type": "text",
                                                                          "text": TRANSCRIBE_INSTRUCTION}]}],
                          thinker_tokens=64, audio=False)  # 64: the tiny model's default length
    got = client.audio.transcriptions.create(model=server.info.id, file=("a.wav", buf.getvalue()), temperature=0)
    assert got.text == ref.text


def test_text_completion_continues_the_raw_prompt_as_transformers_does(client, server, oracle):
    """/v1/completions: the prompt tokenized as it is (no chat template), greedy tokens equal to
    transformers' generate on those ids; n=2 seeded choices are reproducible and use seed + i."""
    import torch

    prompt = "The capital of France is"
    ids = oracle.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want = oracle.hf.thinker.generate(input_ids=ids, max_new_tokens=6, do_sample=False)[0, ids.shape[1]:].tolist()
    got = client.completions.create(model=server.info.id, prompt=prompt, max_tokens=6, temperature=0)
    assert got.usage.prompt_tokens == ids.shape[1]  # no template around it
    assert got.choices[0].text == oracle.tokenizer.decode(want, skip_special_tokens=True)
    two = client.completions.create(model="gpt-4o", prompt=prompt, max_tokens=8, temperature=1.0, seed=5, n=2)
    again = client.completions.create(model="gpt-4o", prompt=prompt, max_tokens=8, temperature=1.0, seed=5, n=2)
    assert [c.text for c in two.choices] == [c.text for c in again.choices]
    alone = client.completions.create(model="gpt-4o", prompt=prompt, max_tokens=8, temperature=1.0, seed=6)
    assert two.choices[1].text == alone.choices[0].text  # choice 1 draws with seed + 1
    chats = client.chat.completions.create(model=server.info.id, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=8, temperature=1.0, seed=5, n=2)
    assert [c.index for c in chats.choices] == [0, 1] and 2 <= chats.usage.completion_tokens <= 16


def test_unknown_voice_is_a_400_listing_voices(client, server):
    with pytest.raises(openai.BadRequestError, match="chelsie") as refused:
        client.chat.completions.create(model=server.info.id, messages=[{"role": "user", "content": "hi"}],
                                       modalities=["text", "audio"], audio={"voice": "nobody", "format": "wav"})
    assert refused.value.body["code"] == "unknown_voice"


def test_make_tiny_subcommand_with_family_seed_and_preset(tmp_path):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    proc = omnid("make-tiny", "qwen3-omni", str(tmp_path / "t"), "--seed", "5", "--preset", "tiny-c")
    assert proc.wait(120) == 0, proc.stderr.read()
    config = json.loads((tmp_path / "t" / "config.json").read_text())
    assert config["talker_config"]["code_predictor_config"]["num_code_groups"] == 16
    assert json.loads((tmp_path / "t" / TINY_MARKER).read_text()) == {"random_weights": True, "preset": "tiny-c",
                                                                       "seed": 5}
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(tmp_path / "t"))
    assert model.talker.model.layers[0].mlp.experts.gate_up_proj.abs().max() > 0  # seeded, not torch.empty
    bad = omnid("make-tiny", "whisper", str(tmp_path / "w"))
    assert bad.wait(60) == 2 and "qwen3-omni" in bad.stderr.read()


def test_embedded_default_is_a_tiny_qwen3_omni(tmp_path, monkeypatch, caplog):
    """`omnid serve` without --model serves a tiny random Qwen3-Omni, made once into the cache dir."""
    from omni.api.cli import build_parser, embedded_default_model, load_model

    monkeypatch.setenv("OMNI_CACHE_DIR", str(tmp_path))
    model_dir, family = embedded_default_model()
    stamp = os.stat(os.path.join(model_dir, "model.safetensors")).st_mtime_ns
    assert embedded_default_model() == (model_dir, family)  # reused, not made again
    assert os.stat(os.path.join(model_dir, "model.safetensors")).st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == ["qwen3-omni-tiny-a-seed0"]
    graph, info = load_model(build_parser().parse_args(["serve"]))
    assert info.family == "qwen3-omni" and info.random_weights and info.speaks
    assert [s.name for s in graph.stages][-2:] == ["talker", "code2wav"]
    graph, info = load_model(build_parser().parse_args(["serve", "--model", "demo"]))
    assert info.family == "demo"
