"""Qwen2.5-Omni served from a config-only directory (`omni_random.json`, no safetensors): every part
draws its weights at load (`load_format="random"`, random_load.py), with the shapes of a real checkpoint,
finite, seeded; the whole graph answers a spoken chat with text and a finite, audible waveform; and the
`full-7b` layout parses into a graph whose every model stage draws its weights (nothing drawn here: 7B)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from omni.kernel.graph import stage_args
from omni.layers.random_init import meta
from omni.models.qwen2_5_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen2_5_omni.checkpoint.random_load import random_part
from omni.models.qwen2_5_omni.graph import TINY_MAX_TOKENS, build
from omni.models.weights import CheckpointError
from qwen3_fixtures import RunningKernel, params, prompts

pytest.importorskip("transformers")

PARTS = ("thinker", "audio_encoder", "vision_encoder", "talker", "token2wav")
MODEL_STAGES = ("audio_encoder", "vision_encoder", "thinker", "talker", "token2wav")
THINKER, TALKER = 8, 24


@pytest.fixture(scope="module")
def config_only(tmp_path_factory):
    return str(make_tiny(tmp_path_factory.mktemp("cfg-a"), seed=5, preset="tiny-a", config_only=True))


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    return str(make_tiny(tmp_path_factory.mktemp("real-a"), seed=0, preset="tiny-a"))


def _draw(model_dir: str, part: str, seed: int = 0, **extra) -> torch.nn.Module:
    return random_part(part, {"model_dir": model_dir, "load_format": "random", "seed": seed, **extra}, "cpu")


def _load(model_dir: str, part: str) -> torch.nn.Module:
    from omni.models.qwen2_5_omni.modules.audio_encoder import AudioEncoder
    from omni.models.qwen2_5_omni.modules.talker import Qwen2_5OmniTalker
    from omni.models.qwen2_5_omni.modules.thinker import Qwen2_5OmniThinker
    from omni.models.qwen2_5_omni.modules.token2wav import Token2Wav
    from omni.models.qwen2_5_omni.modules.vision_encoder import VisionEncoder

    classes = dict(zip(PARTS, (Qwen2_5OmniThinker, AudioEncoder, VisionEncoder, Qwen2_5OmniTalker, Token2Wav)))
    return classes[part].from_checkpoint(model_dir, device="cpu")


def test_the_directory_has_no_weights(config_only):
    from pathlib import Path

    names = {p.name for p in Path(config_only).iterdir()}
    assert not any(n.endswith(".safetensors") or n.endswith(".index.json") for n in names)
    assert {"config.json", "spk_dict.pt", "tokenizer.json", "preprocessor_config.json"} <= names
    marker = json.loads((Path(config_only) / "omni_random.json").read_text())
    assert marker == {"random_weights": True, "load_format": "random", "preset": "tiny-a", "seed": 5}
    with pytest.raises(CheckpointError):  # what `omnid serve` failed with before the stages could draw
        _load(config_only, "thinker")


@pytest.mark.parametrize("part", PARTS)
def test_each_part_draws_finite_seeded_weights_of_the_real_shapes(config_only, real, part):
    model = _draw(config_only, part, seed=1)
    state = model.state_dict()
    assert all(torch.isfinite(t).all() for t in state.values())
    assert all(p.abs().sum() > 0 for name, p in model.named_parameters() if not name.endswith("bias"))
    assert not any(p.requires_grad for p in model.parameters()) and not model.training
    ref = _load(real, part).state_dict()
    assert {k: (tuple(v.shape), v.dtype) for k, v in state.items()} == {k: (tuple(v.shape), v.dtype)
                                                                       for k, v in ref.items()}
    again, other = _draw(config_only, part, seed=1), _draw(config_only, part, seed=2)
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in state.items())
    assert not all(torch.equal(v, other.state_dict()[k]) for k, v in state.items())


def test_parts_draw_in_the_args_dtype_and_only_when_asked(config_only):
    assert _draw(config_only, "thinker", dtype="bfloat16").lm_head.weight.dtype == torch.bfloat16
    assert random_part("thinker", {"model_dir": config_only}, "cpu") is None  # load_format auto: the checkpoint's
    with pytest.raises(CheckpointError):
        random_part("thinker", {"load_format": "random"}, "cpu")


def test_the_random_vocoder_is_audible_and_not_clipped(config_only):
    vocoder = _draw(config_only, "token2wav").code2wav_bigvgan_model
    mel = torch.randn(1, vocoder.cfg.mel_dim, 40, generator=torch.Generator().manual_seed(9)) - 4.0
    pcm = vocoder(mel)[0]
    assert torch.isfinite(pcm).all() and 0.02 < float(pcm.pow(2).mean().sqrt()) < 0.5
    assert float((pcm.abs() >= 0.999).float().mean()) < 0.05


def test_the_graph_serves_a_spoken_chat(config_only, loop):
    graph, info = build(config_only, stage_args={"token2wav": {"num_steps": 2}})
    assert info.random_weights and info.speaks and info.default_max_tokens == TINY_MAX_TOKENS["thinker"]
    for spec in graph.stages:
        args = stage_args(spec)
        if spec.name in MODEL_STAGES:
            assert (args.load_format, args.seed) == ("random", 5), spec.name
    p = params(prompts()["text"], voice="chelsie", thinker_tokens=THINKER, talker_tokens=TALKER, ignore_eos=True)
    p["sampling"]["talker"]["ignore_eos"] = True  # a random talker may never (or at once) say its stop code
    with RunningKernel(loop, graph, mode="inline") as kernel:
        got = kernel.one(p)
    assert len(got.tokens) == THINKER and got.text
    pcm = np.asarray(got.pcm, dtype=np.float32)
    assert pcm.size > 0 and np.isfinite(pcm).all()
    assert float(np.abs(pcm).max()) > 1e-3 and float((np.abs(pcm) >= 0.999).mean()) < 0.5


def test_the_full_7b_layout_draws_every_stage(tmp_path):
    from omni.models.qwen2_5_omni.config import load_omni_config
    from omni.models.qwen2_5_omni.modules.thinker import Qwen2_5OmniThinker

    path = str(make_tiny(tmp_path / "f", seed=7, preset="full-7b"))
    assert json.loads((tmp_path / "f" / "omni_random.json").read_text())["load_format"] == "random"
    graph, info = build(path, device="cuda", dtype="bfloat16")
    assert info.random_weights and info.speaks and info.voices == ["chelsie", "ethan"]
    assert info.default_max_tokens == TINY_MAX_TOKENS["thinker"]
    specs = {s.name: s for s in graph.stages}
    assert set(specs) == {"preprocess", *MODEL_STAGES}
    for name in MODEL_STAGES:
        args = stage_args(specs[name])
        assert (args.load_format, args.seed, args.model_dir) == ("random", 7, path), name
        assert args.dtype == ("" if name == "token2wav" else "bfloat16"), name  # token2wav runs in fp32
    assert stage_args(specs["token2wav"]).dit_dtype == "bfloat16"  # but its DiT in the server's dtype on CUDA
    assert stage_args(build(path, dtype="bfloat16")[0].stage("token2wav")).dit_dtype == ""  # not on the CPU
    assert stage_args(specs["talker"]).default_sampling["max_tokens"] == TINY_MAX_TOKENS["talker"]
    assert "load_format" not in specs["preprocess"].args
    from omni.models.qwen2_5_omni.stages.thinker_stage import eos_ids

    assert eos_ids(path) == (151645,)  # no generation_config.json: the tokenizer's <|im_end|> (an H200 start failed here)
    cfg = load_omni_config(path)
    with meta(torch.bfloat16):  # the shapes only: nothing is allocated
        thinker = Qwen2_5OmniThinker(cfg.thinker, torch.bfloat16)
    assert 7.0e9 < sum(p.numel() for p in thinker.parameters()) < 8.0e9


def test_the_7b_talker_never_samples_a_code_token2wav_cannot_take(tmp_path):
    """The published talker vocabulary (8,448) runs past token2wav's codebook (8,194): random weights
    sampled codes there and every such stream failed at token2wav on the H200 (2026-12-04 call1)."""
    from omni.models.qwen2_5_omni.config import load_omni_config
    from omni.models.qwen2_5_omni.modules.talker import Qwen2_5OmniTalker
    from omni.stages.ar.sampler import SuppressTokens

    cfg = load_omni_config(str(make_tiny(tmp_path / "f", seed=7, preset="full-7b")))
    with meta(torch.bfloat16):
        talker = Qwen2_5OmniTalker(cfg, {}, {})
    vocab, codebook = cfg.talker.text.vocab_size, cfg.token2wav.dit.num_embeds + 1
    assert (vocab, codebook) == (8448, 8194)
    suppress = SuppressTokens(talker.never_sampled(), vocab, "cpu")
    logits = torch.arange(vocab, dtype=torch.float32)[None].repeat(3, 1)  # the top ids win greedily
    for row, stop in enumerate(talker.stop_ids):
        logits[row, stop] = 1e6
    logits[2, list(talker.stop_ids)] = -1e6
    picked = suppress(logits, None, None).argmax(dim=-1).tolist()
    assert picked == [*talker.stop_ids, codebook - 1]  # stop ids stay; otherwise the best decodable code
    assert cfg.talker.codec_bos_id in talker.never_sampled()
