"""Chat templates of either content format (vLLM's detection): a template that iterates over
content parts gets parts (string content as one text part); a template that prints content as one
string gets a string, media placeholders written in by omni; never Python's repr of a list."""

from __future__ import annotations

import numpy as np
import pytest
import requests

from omni.layers.chat_template import OPENAI, STRING, content_format, render_messages
from omni.layers.tokenizer_offline import CHAT_TEMPLATE
from test_api_support import LiveServer

STRING_TEMPLATE = (  # the usual Qwen2-style template of a text checkpoint: content printed whole
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
AUDIO = "<|audio_start|><|audio_pad|><|audio_end|>"
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def test_content_format_detection():
    assert content_format(CHAT_TEMPLATE) == OPENAI
    assert content_format(STRING_TEMPLATE) == STRING
    via_set = ("{% for m in messages %}{% set content = m.content %}{% for part in content %}{{ part.text }}"
               "{% endfor %}{% endfor %}")
    assert content_format(via_set) == OPENAI
    assert content_format("{% for m in messages %}{{ m.content | trim }}{% endfor %}") == STRING
    assert content_format("{% for m in messages %}{{ m['content'] }}{% endfor %}") == STRING
    assert content_format("{{ not a template") == STRING


def test_render_messages_both_ways():
    places = {"audio": AUDIO, "image": IMAGE}
    parts = [{"type": "text", "text": "listen"}, {"type": "audio", "audio": "<audio>"},
             {"type": "image", "image": "<image>"}, {"type": "text", "text": "and look"}]
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": parts}]
    assert render_messages(msgs, STRING, places) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": f"listen\n{AUDIO}\n{IMAGE}\nand look"}]
    assert render_messages(msgs, OPENAI, places) == [
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]}, {"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The tiny Qwen3-Omni twice: its own (parts) template, and the same weights with a string template."""
    import shutil

    from transformers import AutoTokenizer

    from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny

    root = tmp_path_factory.mktemp("templates")
    parts = make_tiny(root / "parts", seed=0, preset="tiny-a")
    string = root / "string"
    shutil.copytree(parts, string)
    tok = AutoTokenizer.from_pretrained(str(string))
    tok.chat_template = STRING_TEMPLATE
    tok.save_pretrained(str(string))
    for leftover in string.glob("chat_template.jinja"):
        leftover.write_text(STRING_TEMPLATE)
    return parts, string


def _prompt(pre, messages) -> str:
    return pre.tokenizer.decode(pre(messages).input_ids.tolist())


def test_preprocessor_renders_text_and_media_in_either_format(checkpoints):
    from omni.models.qwen3_omni.stages.preprocess import Preprocessor

    parts, string = Preprocessor(checkpoints[0]), Preprocessor(checkpoints[1])
    assert (parts.content_format, string.content_format) == (OPENAI, STRING)
    text = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    expected = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    assert _prompt(string, text) == _prompt(parts, text) == expected
    as_parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]}]
    assert _prompt(string, as_parts) == "<|im_start|>user\nhi\nthere<|im_end|>\n<|im_start|>assistant\n"
    pcm = (0.1 * np.sin(np.arange(16000) / 5.0)).astype(np.float32)
    media = [{"role": "user", "content": [{"type": "audio", "audio": {"pcm": pcm, "sample_rate": 16000}},
                                          {"type": "text", "text": "what is this?"}]}]
    got = string(media)
    n = got.audio_token_counts[0]
    assert n > 0 and int((got.input_ids == string.audio_token_id).sum()) == n  # the placeholder, expanded
    assert string.tokenizer.decode(got.input_ids.tolist()) == (
        f"<|im_start|>user\n<|audio_start|>{'<|audio_pad|>' * n}<|audio_end|>\nwhat is this?<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert "[{" not in _prompt(string, media) and "'type'" not in _prompt(string, media)
    np.testing.assert_array_equal(got.audio_features[0], parts(media).audio_features[0])


def _TextServer(ckpt) -> LiveServer:
    """The tiny Qwen3-Omni's text graph, stages in this process."""
    from omni.models.qwen3_omni.graph import build

    return LiveServer(mode="inline", build=lambda: build(ckpt, "text"))


def test_served_string_template_gets_string_prompts(checkpoints):
    """Through omnid: a text request costs the prompt tokens of the plain rendering with either
    template (a string template used to be given a list, and printed its repr)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(checkpoints[0]))
    expected = len(tok("<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n")["input_ids"])
    for ckpt in checkpoints:
        with _TextServer(ckpt) as srv:
            resp = requests.post(srv.url + "/v1/chat/completions", timeout=60, json={
                "model": srv.info.id, "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 2})
            assert resp.status_code == 200, resp.text
            assert resp.json()["usage"]["prompt_tokens"] == expected
