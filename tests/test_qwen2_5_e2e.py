"""Qwen2.5-Omni served through omni's graph (the kernel, its actors in-process) against transformers:
greedy thinker tokens exactly equal for text, audio and image chat prompts on two tiny random
checkpoints (transformers' inputs from its own processor: omni's preprocessing is under test too), and
8 concurrent requests answer as each does alone."""

from __future__ import annotations

import pytest

from omni.models.qwen2_5_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen2_5_omni.graph import build
from omni.models.registry import REGISTRY
from qwen2_5_fixtures import Oracle25
from qwen3_fixtures import LoopThread, RunningKernel, params, prompts

pytest.importorskip("transformers")

THINKER = 12
KINDS = ["text", "audio", "image", "audios", "images"]


@pytest.fixture(scope="module")
def loop():
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture(scope="module", params=["tiny-a", "tiny-b"])
def served(request, loop, tmp_path_factory):
    ckpt = str(make_tiny(tmp_path_factory.mktemp(request.param), seed=0, preset=request.param))
    oracle = Oracle25(ckpt)
    graph, info = build(ckpt, "text")
    with RunningKernel(loop, graph, mode="inline") as kernel:
        yield oracle, kernel, info


def _ask(messages):
    return params(messages, voice=None, thinker_tokens=THINKER, modalities=("text",))


@pytest.mark.parametrize("kind", KINDS)
def test_chat_tokens_equal_transformers(served, kind):
    oracle, kernel, _ = served
    messages = prompts()[kind]
    ref = oracle.generate(messages, thinker_tokens=THINKER)
    got = kernel.one(_ask(messages))
    assert got.tokens == ref.tokens and len(set(ref.tokens)) > 1
    assert got.text == ref.text
    prompt_len = len(oracle.inputs(messages)["input_ids"][0])
    assert got.final["usage"] == {"prompt_tokens": prompt_len, "completion_tokens": len(ref.tokens)}


def test_concurrent_requests_equal_alone(served):
    _, kernel, _ = served
    kinds = (KINDS * 2)[:8]
    alone = [kernel.one(_ask(prompts()[k])).tokens for k in kinds]
    together = [r.tokens for r in kernel.many([_ask(prompts()[k]) for k in kinds])]
    assert together == alone


def test_the_family_is_picked_from_the_architecture(served):
    _, _, info = served
    entry = REGISTRY.family_for(["Qwen2_5OmniForConditionalGeneration"])
    assert entry.name == "qwen2.5-omni" and info.family == "qwen2.5-omni"
    assert info.random_weights and info.max_context and not info.speaks
