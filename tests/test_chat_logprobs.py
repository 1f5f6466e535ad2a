"""Chat `logprobs` / `top_logprobs` from the engine's logits: each chosen token's log-probability and
the most likely alternatives, equal to transformers' thinker on the same tokens; streamed chunks
carry them too; a model that cannot report them, and top_logprobs without logprobs, are a 400."""

from __future__ import annotations

import math

import openai
import pytest
import torch

from test_chat_template import _TextServer

TOP = 3


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("logprobs") / "tiny", seed=2, preset="tiny-a")


@pytest.fixture(scope="module")
def client(ckpt):
    with _TextServer(ckpt) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60), srv.info.id


def reference(ckpt, tokens: list[int]) -> torch.Tensor:
    """transformers' thinker, teacher-forced on prompt + `tokens`: log-probs [len(tokens), V]."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from omni.models.qwen3_omni.stages.preprocess import Preprocessor

    prompt = Preprocessor(ckpt)([{"role": "user", "content": "hi there"}]).input_ids.tolist()
    hf = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(ckpt)).eval()
    with torch.no_grad():
        logits = hf.thinker(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1:-1], -1)


def test_logprobs_equal_transformers_whole_and_streamed(client, ckpt):
    client, model = client
    ask = dict(model=model, messages=[{"role": "user", "content": "hi there"}], max_tokens=6, temperature=0,
               logprobs=True, top_logprobs=TOP)
    whole = client.chat.completions.create(**ask)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == 6
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ckpt))
    # the tiny tokenizer: one token per byte (id = the byte), special tokens by name
    ids = [[c.bytes[0]] if len(c.bytes) == 1 else [tok.convert_tokens_to_ids(c.token)] for c in content]
    text = bytes(b for c in content if len(c.bytes) == 1 for b in c.bytes).decode("utf-8", "replace")
    assert text == whole.choices[0].message.content
    ref = reference(ckpt, [i[0] for i in ids])
    for row, c, i in zip(ref, content, ids):
        assert c.logprob == pytest.approx(float(row[i[0]]), abs=1e-4)
        values, _ = row.topk(TOP)
        assert [t.logprob for t in c.top_logprobs] == pytest.approx(values.tolist(), abs=1e-4)
        assert c.top_logprobs[0].logprob == pytest.approx(c.logprob, abs=1e-6)  # greedy: the chosen is the likeliest
        assert sum(math.exp(t.logprob) for t in c.top_logprobs) <= 1.0 + 1e-6 and c.logprob <= 0
    streamed = [ch for ch in client.chat.completions.create(**ask, stream=True) if ch.choices and ch.choices[0].logprobs]
    assert [e.logprob for ch in streamed for e in ch.choices[0].logprobs.content] == [c.logprob for c in content]
    plain = client.chat.completions.create(**{**ask, "logprobs": False, "top_logprobs": None})
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == whole.choices[0].message.content
    only_chosen = client.chat.completions.create(**{**ask, "top_logprobs": None})
    assert all(c.top_logprobs == [] for c in only_chosen.choices[0].logprobs.content)


def test_logprobs_refusals(client):
    client, model = client
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], top_logprobs=2)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], logprobs=True,
                                       top_logprobs=21)


def test_a_model_without_logprobs_refuses_them():
    from test_api_support import LiveServer

    with LiveServer() as srv:  # the demo reports none
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)
        with pytest.raises(openai.BadRequestError, match="does not report log-probabilities"):
            client.chat.completions.create(model="omni-demo", messages=[{"role": "user", "content": "x"}], logprobs=True)
