"""omnid serving a tiny Qwen2.5-Omni (its actors in-process) to the official `openai` client: a greedy
chat answers text equal to transformers' and audio of the reference's length, whole and streamed; and
`omnid make-tiny qwen2.5-omni` writes tiny checkpoints transformers loads and the full 7B layout."""

from __future__ import annotations

import base64
import json

import numpy as np
import openai
import pytest

from omni.models.qwen2_5_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen2_5_omni.graph import build
from qwen2_5_fixtures import Oracle25
from test_api_cli import omnid
from test_api_support import LiveServer

pytest.importorskip("transformers")

THINKER, TALKER = 12, 24
GREEDY = {"stage_sampling": {"talker": {"temperature": 0, "max_tokens": TALKER, "repetition_penalty": 1.0}}}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(make_tiny(tmp_path_factory.mktemp("tiny-a"), seed=2, preset="tiny-a"))


@pytest.fixture(scope="module")
def server(ckpt):
    with LiveServer(mode="inline", build=lambda: build(ckpt, stage_args={"token2wav": {"num_steps": 2}})) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_chat_answers_text_and_audio(client, server, ckpt):
    oracle = Oracle25(ckpt)
    text = "hello there, how are you today?"
    ref = oracle.generate([{"role": "user", "content": text}], "Ethan", THINKER, TALKER, audio=True)
    kwargs = dict(model=server.info.id, messages=[{"role": "user", "content": text}], modalities=["text", "audio"],
                  audio={"voice": "ethan", "format": "pcm16"}, temperature=0, max_tokens=THINKER, extra_body=GREEDY)
    whole = client.chat.completions.create(**kwargs)
    message = whole.choices[0].message
    assert message.content == ref.text and whole.usage.completion_tokens == len(ref.tokens)
    pcm = np.frombuffer(base64.b64decode(message.audio.data), dtype="<i2")
    assert pcm.shape == ref.wav.shape and np.abs(pcm).max() > 0
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.text
    data = b"".join(base64.b64decode(c.choices[0].delta.audio.data) for c in chunks
                    if c.choices and c.choices[0].delta.audio and c.choices[0].delta.audio.data)
    assert len(data) == 2 * ref.wav.size
    assert client.models.retrieve(server.info.id).id == server.info.id and server.info.voices == ["chelsie", "ethan"]


def test_make_tiny_subcommand_presets(tmp_path):
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    from omni.models.qwen2_5_omni.checkpoint.make_tiny import main
    from omni.models.qwen2_5_omni.config import load_omni_config
    from omni.models.registry import REGISTRY

    assert REGISTRY.tiny_writers["qwen2.5-omni"] == "omni.models.qwen2_5_omni.checkpoint.make_tiny:main"
    assert main([str(tmp_path / "b"), "--seed", "4", "--preset", "tiny-b"]) == 0  # in-process: omnid runs it below
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(str(tmp_path / "b"))
    assert model.config.thinker_config.text_config.num_key_value_heads == 1 and set(model.speaker_map) == {"Chelsie", "Ethan"}
    for name in ("tokenizer.json", "preprocessor_config.json", "spk_dict.pt", "generation_config.json"):
        assert (tmp_path / "b" / name).is_file()
    full = omnid("make-tiny", "qwen2.5-omni", str(tmp_path / "f"), "--preset", "full-7b")
    assert full.wait(120) == 0, full.stderr.read()
    cfg = Qwen2_5OmniConfig.from_pretrained(str(tmp_path / "f"))
    assert cfg.thinker_config.text_config.hidden_size == 3584 and cfg.thinker_config.text_config.num_hidden_layers == 28
    ours = load_omni_config(tmp_path / "f")
    assert ours.thinker.vision.depth == 32 and ours.talker.text.vocab_size == 8448
    assert json.loads((tmp_path / "f" / "omni_random.json").read_text())["preset"] == "full-7b"
