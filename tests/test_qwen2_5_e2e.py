"""Qwen2.5-Omni served through omni's graph (the kernel, its actors in-process) against transformers:
greedy thinker tokens exactly equal for text, audio, image, two-audio and two-image chat prompts on two
tiny random checkpoints (transformers' inputs from its own processor: omni's preprocessing is under test
too); the talker's greedy codes exactly equal the ones transformers' `generate` hands its token2wav (text
and audio prompts: the reference cannot speak after an image prompt), with and without its repetition
penalty; a spoken answer comes back as text and audio; 8 concurrent requests answer as each does alone."""

from __future__ import annotations

import pytest

from omni.models.qwen2_5_omni.graph import build
from omni.models.registry import REGISTRY
from qwen2_5_fixtures import Oracle25, served_tiny
import numpy as np  # noqa: E402

from qwen3_fixtures import params, prompts

pytest.importorskip("transformers")

THINKER, TALKER = 12, 30
KINDS = ["text", "audio", "image", "audios", "images"]


@pytest.fixture(scope="module", params=["tiny-a", "tiny-b"])
def served(request, loop, tmp_path_factory):
    with served_tiny(request.param, loop, tmp_path_factory) as (ckpt, info, kernel):
        yield Oracle25(ckpt), kernel, info, request.param


def _ask(messages):
    return params(messages, voice=None, thinker_tokens=THINKER, modalities=("text",))


@pytest.mark.parametrize("kind", KINDS)
def test_chat_tokens_equal_transformers(served, kind):
    oracle, kernel, _, _ = served
    messages = prompts()[kind]
    ref = oracle.generate(messages, thinker_tokens=THINKER)
    got = kernel.one(_ask(messages))
    assert got.tokens == ref.tokens and len(set(ref.tokens)) > 1
    assert got.text == ref.text
    prompt_len = len(oracle.inputs(messages)["input_ids"][0])
    assert got.final["usage"] == {"prompt_tokens": prompt_len, "completion_tokens": len(ref.tokens)}


def _speak(messages, penalty: float = 1.0):
    p = params(messages, voice="chelsie", thinker_tokens=THINKER, talker_tokens=TALKER)
    p["sampling"]["talker"]["repetition_penalty"] = penalty
    return p


@pytest.mark.parametrize("kind, penalty", [("text", 1.0), ("audio", 1.0), ("audios", 1.0), ("text", 1.05)])
def test_talker_codes_equal_transformers(served, kind, penalty):
    oracle, kernel, info, _ = served
    ref = oracle.generate(prompts()[kind], "Chelsie", THINKER, TALKER, audio=True, penalty=penalty)
    got = kernel.one(_speak(prompts()[kind], penalty))
    assert got.tokens == ref.tokens
    assert got.codes is not None and len(set(ref.codes.tolist())) > 2
    assert got.codes.reshape(-1).tolist() == ref.codes.tolist()
    # the spoken answer: text and audio, a token2wav frame run per code (the reference's length)
    assert got.text == ref.text and got.pcm.shape == ref.wav.shape and np.isfinite(got.pcm).all()
    assert float(np.abs(got.pcm).max()) > 1e-4 and info.speaks and info.voices == ["chelsie", "ethan"]


def test_concurrent_requests_equal_alone(served):
    _, kernel, _, preset = served
    if preset != "tiny-b":
        return  # one checkpoint is enough for batching (CI time)
    kinds = (KINDS * 2)[:8]
    asks = [_speak(prompts()[k]) if i % 2 else _ask(prompts()[k]) for i, k in enumerate(kinds)]  # half speak
    alone = [kernel.one(a) for a in asks]
    together = kernel.many(asks)
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    for a, b in zip(together, alone):
        assert (a.codes is None) == (b.codes is None)
        if a.codes is not None:
            assert a.codes.tolist() == b.codes.tolist() and a.pcm.shape == b.pcm.shape


def test_the_family_is_picked_from_the_architecture(served):
    _, _, info, _ = served
    entry = REGISTRY.family_for(["Qwen2_5OmniForConditionalGeneration"])
    assert entry.name == "qwen2.5-omni" and info.family == "qwen2.5-omni"
    assert info.random_weights and info.max_context and info.speaks
    graph, text_info = build(info.model_dir, "text")
    assert [s.name for s in graph.stages] == ["preprocess", "audio_encoder", "vision_encoder", "thinker"]
    assert not text_info.speaks


def test_talker_stage_warms_up_through_its_serving_path(served):
    from omni.kernel.stage import StageContext

    _, _, info, preset = served
    if preset != "tiny-a":
        return
    stage = REGISTRY.stage_class("qwen2.5-omni.talker")(StageContext(name="talker", args={"model_dir": info.model_dir,
                                                                                          "max_model_len": 64}))
    stage.setup()
    assert stage.warm_up(force=True) == len(stage.warm_lengths()) > 1
    assert stage.engine.stats()["free_blocks"] == stage.engine.config.num_blocks
