"""The full-size Qwen3-Omni-30B-A3B preset and `load_format="random"`.

On the meta device the preset has the published parameter count, part by part equal to
transformers' model of the same config; a scaled-down random load on CPU gives a working
thinker (tokens, deterministic per seed), and a random model dir serves a speech request
through the whole graph with every stage drawing its own weights."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from omni.models.qwen3_omni.config import load_config
from omni.models.qwen3_omni.checkpoint.presets_full import (
    PUBLISHED,
    full_config,
    scaled_config,
    thinker_active_bytes,
    write_random_model_dir,
)
from omni.layers.random_init import check_materialized
from omni.models.loading import load_format
from omni.models.qwen3_omni.checkpoint.random_load import random_part, random_thinker
from omni.layers.tokenizer_offline_full import SPECIAL_IDS
from omni.models.weights import CheckpointError
from omni.stages.ar.config import EngineConfig
from omni.stages.ar.engine import AREngine
from omni.stages.ar.sequence import SamplingParams


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.fixture(scope="module")
def full_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("full")
    (d / "config.json").write_text(json.dumps(full_config()))
    return d


def test_full_preset_has_the_published_sizes(full_dir):
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration
    from transformers.utils import logging as hf_logging

    from omni.models.qwen3_omni.modules.audio_encoder import AudioEncoder
    from omni.models.qwen3_omni.modules.code2wav import Code2Wav
    from omni.models.qwen3_omni.modules.talker import TalkerModel
    from omni.models.qwen3_omni.modules.thinker import Qwen3OmniThinker
    from omni.models.qwen3_omni.modules.vision_encoder import VisionEncoder

    cfg = load_config(full_dir)
    with torch.device("meta"):
        ours = {"thinker_text": _count(Qwen3OmniThinker(cfg.thinker)), "audio": _count(AudioEncoder(cfg.thinker.audio)),
                "vision": _count(VisionEncoder(cfg.thinker.vision)), "talker": _count(TalkerModel(cfg)),
                "code2wav": _count(Code2Wav(cfg.code2wav))}
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            hf = Qwen3OmniMoeForConditionalGeneration(Qwen3OmniMoeConfig(**full_config()))
        finally:
            hf_logging.set_verbosity(verbosity)
    th = hf.thinker.model
    theirs = {"thinker_text": _count(hf.thinker) - _count(th.audio_tower) - _count(th.visual),
              "audio": _count(th.audio_tower), "vision": _count(th.visual), "talker": _count(hf.talker),
              "code2wav": _count(hf.code2wav)}
    for part, n in theirs.items():
        assert ours[part] == pytest.approx(n, rel=0.01), part
    total = sum(ours.values())
    assert total == pytest.approx(PUBLISHED["total_params"], rel=0.01)
    assert total * 2 / 2**30 == pytest.approx(PUBLISHED["bf16_gib"], rel=0.01)
    assert ours["code2wav"] == pytest.approx(PUBLISHED["code2wav_params"], rel=0.01)
    assert thinker_active_bytes(cfg.thinker) == pytest.approx(PUBLISHED["thinker_active_bytes"], rel=0.01)
    assert cfg.thinker.text.num_layers == 48 and cfg.talker.accept_hidden_layer == 24
    assert cfg.im_end_token_id == SPECIAL_IDS["<|im_end|>"] and cfg.thinker.audio_token_id == SPECIAL_IDS["<|audio_pad|>"]


@pytest.fixture(scope="module")
def scaled_dir(tmp_path_factory):
    return write_random_model_dir(tmp_path_factory.mktemp("scaled"), scaled_config(), seed=0)


def _greedy(model, prompt, n=8) -> list[int]:
    spec = model.kv_cache_spec()
    engine = AREngine(model, EngineConfig(num_blocks=16, block_size=16, max_model_len=256, dtype=""))
    assert spec.num_layers == 2
    return engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))[0]


def test_scaled_random_thinker_generates_deterministically(scaled_dir):
    cfg = load_config(scaled_dir).thinker
    prompt = [SPECIAL_IDS["<|im_start|>"], 872, 104, 105, SPECIAL_IDS["<|im_end|>"], SPECIAL_IDS["<|im_start|>"], 77091]
    a = random_thinker(cfg, "cpu", torch.float32, seed=3, std=0.3)
    b = random_thinker(cfg, "cpu", torch.float32, seed=3, std=0.3)
    c = random_thinker(cfg, "cpu", torch.float32, seed=4, std=0.3)
    for (name, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(pa, pb), name
        if "norm" not in name:
            assert not torch.equal(pa, pc), name
    assert a.model.layers[0].input_layernorm.weight.eq(1).all()
    tokens = _greedy(a, prompt)
    assert len(tokens) == 8 and all(0 <= t < cfg.text.vocab_size for t in tokens)
    assert len(set(tokens)) > 1
    assert _greedy(b, prompt) == tokens
    assert _greedy(c, prompt) != tokens
    bf16 = random_thinker(cfg, "cpu", torch.bfloat16, seed=3)
    assert bf16.lm_head.weight.dtype == torch.bfloat16 and bf16.kv_cache_spec().dtype == torch.bfloat16
    assert len(_greedy(bf16, prompt, 4)) == 4


def test_every_part_materializes(scaled_dir):
    args = {"model_dir": str(scaled_dir), "load_format": "random", "dtype": "float32"}
    for part in ("thinker", "talker", "code2wav", "audio_encoder", "vision_encoder"):
        model = random_part(part, {**args, **({"model": args["model_dir"]} if "encoder" in part else {})}, "cpu")
        check_materialized(model)
        assert all(not t.isnan().any() for t in model.state_dict().values() if t.is_floating_point()), part
    assert random_part("thinker", {"model_dir": str(scaled_dir)}, "cpu") is None
    with pytest.raises(CheckpointError, match="load_format"):
        load_format({"load_format": "pickle"})


def test_random_dir_serves_speech_through_the_graph(scaled_dir):
    from omni.kernel.kernel import Kernel
    from omni.models.qwen3_omni.graph import build

    graph, info = build(str(scaled_dir), threads=1, dtype="float32")
    assert info.random_weights
    assert all(s.args.get("load_format") == "random" for s in graph.stages if s.name != "preprocess")
    params = {"task": "chat", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
              "modalities": ["text", "audio"], "voice": "ethan",
              "sampling": {"thinker": {"temperature": 0, "max_tokens": 6, "ignore_eos": True},
                           "talker": {"temperature": 0, "max_tokens": 5, "ignore_eos": True}}}

    async def run():
        async with Kernel(graph, mode="inline") as kernel:
            events = [ev async for ev in kernel.submit(params, deadline_s=60)]
        return events

    events = asyncio.run(run())
    tokens = [t for ev in events if ev.port == "text" and ev.data for t in ev.data.get("token_ids", [])]
    samples = sum(len(ev.data["pcm"]) // 4 if isinstance(ev.data["pcm"], (bytes, bytearray, memoryview))
                  else len(ev.data["pcm"]) for ev in events if ev.port == "audio" and ev.data and "pcm" in ev.data)
    assert len(tokens) == 6
    assert samples > 0
