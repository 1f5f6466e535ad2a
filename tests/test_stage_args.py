"""Typed, strict stage args: an unknown or mistyped field fails when the graph is built, naming the
stage and the field, from Python, a TOML / YAML file and `--set` alike; the stage-level max_batch
leaves each kind's own default when unset and is the AR stage's max_num_seqs; backend switches are
stage args applied once at set-up (the environment is not read per forward)."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

from omni.api.cli import CliError, build_parser, load_model
from omni.kernel.errors import GraphError
from omni.config import apply_overrides, load_override_file, parse_set_flags
from omni.kernel.graph import Graph, StageSpec, stage_args
from omni.models.registry import REGISTRY
from omni.kernel.stage import StageContext
from omni.layers import fused_ops, moe_routed
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.graph import build
from omni.stages.args import EncoderArgs, StageArgs
from omni.stages.encoder import EncoderStage
from omni.stages.vocoder import CPU_MAX_BATCH, VocoderStage


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(make_tiny(tmp_path_factory.mktemp("tiny"), seed=0, preset="tiny-a"))


def test_unknown_field_from_python(tiny):
    graph, _ = build(tiny)
    graph.stage("thinker").args["num_block"] = 64
    with pytest.raises(GraphError, match=r"stage 'thinker': unknown args field 'num_block'; did you mean 'num_blocks'"):
        graph.validate()
    with pytest.raises(GraphError, match=r"stage 'audio_encoder': unknown args field 'max_batches'"):
        build(tiny, stage_args={"audio_encoder": {"max_batches": 4}})


def test_unknown_and_mistyped_fields_from_toml_and_yaml(tiny, tmp_path):
    toml = tmp_path / "o.toml"
    toml.write_text("[stages.thinker.args]\nnum_block = 64\n")
    with pytest.raises(GraphError, match=r"stage 'thinker': unknown args field 'num_block'"):
        apply_overrides(build(tiny)[0], load_override_file(toml))
    yml = tmp_path / "o.yaml"
    yml.write_text("stages:\n  code2wav:\n    args: {chunk_frames: many}\n")
    with pytest.raises(GraphError, match=r"stage 'code2wav': args.chunk_frames: Expected `int`, got `str`"):
        apply_overrides(build(tiny)[0], load_override_file(yml))
    toml.write_text("[stage.thinker.args]\nnum_blocks = 512\n")  # a misspelt table is no quieter
    with pytest.raises(GraphError, match=r"only a \[model\] table and \[stages.<name>\] tables, got \['stage'\]"):
        load_override_file(toml)
    toml.write_text("[stages.thinker.args]\nnum_blocks = 512\n")  # a known field passes, typed
    graph = apply_overrides(build(tiny)[0], load_override_file(toml))
    assert stage_args(graph.stage("thinker")).num_blocks == 512


@pytest.mark.parametrize("flag, needle", [
    ("thinker.args.num_block=64", r"stage 'thinker': unknown args field 'num_block'"),
    ("thinker.args.block_size=big", r"stage 'thinker': args.block_size: Expected `int`, got `str`"),
    ("talker.args.fused_ops=3", r"stage 'talker': args.fused_ops: Expected `bool`, got `int`"),
    ("thinker.args.moe_backend=cutlass", r"stage 'thinker': args: moe_backend must be one of"),
    ("thinker.args.num_blocks=2", r"stage 'thinker': args: KV cache of 2 blocks"),  # EngineConfig's own check
    ("code2wav.args.max_batch=4", r"stage 'code2wav': max_batch is a stage field: set code2wav.max_batch"),
    ("preprocess.max_batch=many", r"preprocess.max_batch"),
])
def test_set_flags_are_checked_through_omnid(tiny, flag, needle):
    args = build_parser().parse_args(["serve", "--model", tiny, "--set", flag])
    with pytest.raises(CliError, match=needle):
        load_model(args)


def test_kind_defaults_apply_when_max_batch_is_unset(tiny):
    graph, _ = build(tiny)
    assert all(spec.max_batch is None for spec in graph.stages)
    encoder = EncoderStage(StageContext("audio_encoder", args=stage_args(graph.stage("audio_encoder"))))
    assert encoder.max_batch == EncoderArgs.max_batch == 16  # not the old 32 the driver always wrote
    cpu_codec = types.SimpleNamespace(device="cpu")
    vocoder = VocoderStage(StageContext("code2wav", args=stage_args(graph.stage("code2wav"))), codec=cpu_codec)
    assert vocoder.max_batch == CPU_MAX_BATCH == 8
    assert stage_args(graph.stage("preprocess")).max_batch == 8
    graph = apply_overrides(graph, parse_set_flags(["audio_encoder.max_batch=4", "code2wav.max_batch=3"]))
    assert EncoderStage(StageContext("a", args=stage_args(graph.stage("audio_encoder")))).max_batch == 4
    assert VocoderStage(StageContext("c", args=stage_args(graph.stage("code2wav"))), codec=cpu_codec).max_batch == 3


def test_ar_stage_takes_max_batch_as_max_num_seqs(tiny):
    from omni.models.qwen3_omni.stages.thinker_stage import ThinkerStage

    graph, _ = build(tiny, variant="text")
    assert stage_args(graph.stage("thinker")).max_num_seqs == 32  # the engine's default
    graph = apply_overrides(graph, parse_set_flags(["thinker.max_batch=5"]))
    stage = ThinkerStage(StageContext("thinker", args=stage_args(graph.stage("thinker")), out_ports=["text"]))
    stage.setup()
    assert stage.engine.config.max_num_seqs == 5 and stage.engine.scheduler.max_num_seqs == 5
    with pytest.raises(GraphError, match=r"max_batch=5 and args.max_num_seqs=7 are one setting"):
        apply_overrides(graph, parse_set_flags(["thinker.args.max_num_seqs=7"]))
    same = apply_overrides(graph, parse_set_flags(["thinker.args.max_num_seqs=5"]))  # agreeing: fine
    assert stage_args(same.stage("thinker")).max_num_seqs == 5


def test_stage_device_is_the_engine_device(tiny):
    graph, _ = build(tiny, variant="text", device="cuda:1")
    assert stage_args(graph.stage("thinker")).device == "cuda:1"
    graph.stage("thinker").args["device"] = "cuda:0"
    with pytest.raises(GraphError, match=r"device=cuda:1 and args.device='cuda:0' are one setting"):
        graph.validate()


def test_backend_switches_are_read_once_at_setup(tiny, monkeypatch):
    from omni.models.qwen3_omni.stages.thinker_stage import ThinkerStage

    monkeypatch.setattr(moe_routed, "_FORCED", None)  # restored after the test
    monkeypatch.setattr(fused_ops, "_ON", True)
    graph, _ = build(tiny, variant="text")
    graph = apply_overrides(graph, parse_set_flags(["thinker.args.moe_backend=grouped",
                                                    "thinker.args.fused_ops=false"]))
    stage = ThinkerStage(StageContext("thinker", args=stage_args(graph.stage("thinker")), out_ports=["text"]))
    stage.setup()
    monkeypatch.setenv("OMNI_MOE_BACKEND", "bmm")  # the old variables: no longer read by any forward
    monkeypatch.setenv("OMNI_FUSED_OPS", "1")
    with pytest.raises(moe_routed.MoeBackendError, match="'grouped' cannot run"):
        moe_routed.choose_backend(torch.zeros(2, 4), F.silu)  # forced by the stage arg, not by the env
    assert not fused_ops.enabled(types.SimpleNamespace(is_cuda=True))


def test_kinds_without_an_args_class_keep_free_form_args():
    assert REGISTRY.stage_args_class("demo.generator") is None
    graph = Graph("g", [StageSpec("gen", "demo.generator", args={"anything": [1, 2]}, max_batch=3)],
                  [], entry="gen")
    assert stage_args(graph.stage("gen")) == {"anything": [1, 2], "max_batch": 3}


def test_registered_kinds_name_their_args_class():
    """Each typed kind's stage class reads the class it is registered with (in-process dicts too)."""
    from omni.kernel.registry import resolve

    typed = {kind: REGISTRY.stage_args_class(kind) for kind in REGISTRY.stage_kinds}
    typed = {kind: cls for kind, cls in typed.items() if cls is not None}
    assert {"qwen3-omni.thinker", "qwen3-omni.code2wav", "whisper.decoder"} <= set(typed)
    for kind, cls in typed.items():
        assert issubclass(cls, StageArgs), kind
        stage_cls = resolve(REGISTRY.stage_kinds[kind])
        declared = getattr(stage_cls, "Args", None)
        assert declared is None or declared is cls, kind


def test_a_plugin_kind_declares_its_args(monkeypatch):
    from pathlib import Path

    from omni.kernel.registry import resolve

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "plugins" / "omni-example"))
    for name in ("stage_kinds", "stage_args", "families"):  # registered for this test only
        monkeypatch.setattr(REGISTRY, name, dict(getattr(REGISTRY, name)))
    import omni_example

    omni_example.register(REGISTRY)
    graph, _ = resolve(REGISTRY.families["example-reverse"].target)()
    assert stage_args(apply_overrides(graph, parse_set_flags(["reverse.args.upper=true"])).stage("reverse")).upper
    with pytest.raises(GraphError, match=r"stage 'reverse': unknown args field 'uper'"):
        apply_overrides(graph, parse_set_flags(["reverse.args.uper=true"]))


def test_checking_args_imports_no_torch():
    """The kernel checks a graph's args in the API process: the args classes are torch-free."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from omni.kernel.graph import StageSpec, stage_args\n"
            "for kind in ('qwen3-omni.thinker', 'qwen3-omni.talker', 'qwen3-omni.code2wav', 'qwen3-omni.preprocess',\n"
            "             'qwen3-omni.audio_encoder', 'whisper.encoder', 'whisper.decoder'):\n"
            "    stage_args(StageSpec('s', kind, args={'threads': 1}))\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False", out.stderr
