"""CUDA graphs are the default on CUDA, checked on a CPU-only machine: the settings every decode
engine and vocoder reads (EngineConfig.graphs_on, the vocoder's `cuda_graphs`) as the served
Qwen3-Omni and Qwen3-TTS graphs give them for `--device cuda`, and the one flag that turns them off."""

from __future__ import annotations

import types

import pytest

from omni.config import apply_overrides, parse_set_flags
from omni.kernel.graph import stage_args
from omni.stages.ar.config import EngineConfig
from omni.stages.ar.stage import ARStage
from omni.stages.args import VocoderArgs


def test_engine_config_turns_graphs_on_wherever_it_runs_on_cuda():
    assert EngineConfig(device="cuda").graphs_on and EngineConfig(device="cuda:1").graphs_on
    assert not EngineConfig().graphs_on  # cpu: nothing to capture
    assert not EngineConfig(device="cuda", cuda_graphs=False).graphs_on  # the one way off
    assert EngineConfig(device="cpu", cuda_graphs=True).graphs_on  # asked for: the engine warns and runs eagerly
    assert VocoderArgs().cuda_graphs is True


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
    from omni.models.qwen3_omni.graph import build
    from omni.models.qwen3_tts.checkpoint.make_tiny import make_tiny as make_tiny_tts
    from omni.models.qwen3_tts.graph import build as build_tts

    omni_dir = str(make_tiny(tmp_path_factory.mktemp("omni"), seed=0))
    tts_dir = str(make_tiny_tts(tmp_path_factory.mktemp("tts"), "custom-voice", "tiny-a", seed=0))
    return {"qwen3-omni": lambda **kw: build(omni_dir, **kw)[0], "qwen3-tts": lambda **kw: build_tts(tts_dir, **kw)[0]}


AR_STAGES = {"qwen3-omni": ("thinker", "talker"), "qwen3-tts": ("talker",)}
VOCODERS = {"qwen3-omni": "code2wav", "qwen3-tts": "codec"}


@pytest.mark.parametrize("family", list(AR_STAGES))
def test_served_graphs_on_cuda_capture_decode_graphs_by_default(graphs, family):
    """What `omnid serve --device cuda` builds: every AR stage's engine (and so the code
    predictor's graphs, which read the same `graphs_on`) and the vocoder capture graphs; on CPU none."""
    on_cuda, on_cpu = graphs[family](device="cuda"), graphs[family]()
    for name in AR_STAGES[family]:
        args = stage_args(on_cuda.stage(name))
        assert args.cuda_graphs is None and args.engine_config().graphs_on, name
        # the engine the stage builds runs on the replica's device (a CPU-default context takes the args')
        stage = types.SimpleNamespace(ctx=types.SimpleNamespace(device="cuda:0", args=args))
        assert ARStage.engine_config(stage).graphs_on and ARStage.engine_config(stage).device == "cuda:0"
        assert not stage_args(on_cpu.stage(name)).engine_config().graphs_on, name
    assert stage_args(on_cuda.stage(VOCODERS[family])).cuda_graphs is True
    off = apply_overrides(graphs[family](device="cuda"),
                          parse_set_flags([f"{AR_STAGES[family][0]}.args.cuda_graphs=false"]))
    assert not stage_args(off.stage(AR_STAGES[family][0])).engine_config().graphs_on
