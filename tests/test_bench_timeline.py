"""bench/timeline.py: per-stage shares that add up, against live omnid apps on tiny checkpoints of both
speech families (Qwen3-Omni chat with audio, Qwen3-TTS speech). No timed asserts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from test_api_support import LiveServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import gpu_sampler  # noqa: E402
import timeline  # noqa: E402

pytest.importorskip("aiohttp")
SHARES = ("idle", "feed", "host", "gpu", "emit", "credit")


def test_a_replicas_level_is_split_into_shares_of_its_wall_time():
    before = {"time_s": {"idle": 1.0, "compute": 1.0, "emit": 0.5, "credit_wait": 0.0, "setup": 9.0, "step": 0.8,
                         "gpu": 0.5, "recv": 0.1}, "steps": 10, "num_steps": 10, "num_generated_tokens": 40}
    after = {"time_s": {"idle": 3.0, "compute": 5.0, "emit": 1.5, "credit_wait": 1.0, "setup": 9.0, "step": 4.8,
                        "gpu": 3.5, "recv": 0.6}, "steps": 30, "num_steps": 30, "num_generated_tokens": 200}
    row = timeline.stage_timeline(before, after)
    assert row["wall_s"] == 8.0 and row["steps"] == 20 and row["ms_per_step"] == 200.0
    assert row["seconds"] == {"idle": 2.0, "feed": 0.0, "host": 1.0, "gpu": 3.0, "emit": 1.0, "credit": 1.0}
    assert row["share_pct"]["gpu"] == 37.5 and row["busy_pct"] == 75.0 and row["recv_pct"] == 6.2
    assert row["rows_per_step"] == 8.0  # 160 tokens over 20 engine steps
    off_cuda = timeline.stage_timeline({"time_s": {}}, {"time_s": {"idle": 1.0, "compute": 1.0, "step": 0.5}})
    assert off_cuda["share_pct"]["gpu"] is None and off_cuda["share_pct"]["host"] == 25.0


def test_gpu_samples_are_summarised_per_gpu():
    summary = gpu_sampler.summarize([(0, 50.0, 1000.0), (1, 10.0, 5.0), (0, 100.0, 1200.0)])
    assert summary["gpu0"] == {"samples": 2, "util_mean": 75.0, "util_p50": 75.0, "util_max": 100.0,
                               "mem_used_max_mib": 1200.0}
    assert summary["gpu1"]["samples"] == 1 and gpu_sampler.summarize([]) is None


def _check(report: dict, out: Path, label: str, stages: set[str]) -> None:
    assert json.loads((out / f"timeline-{label}.json").read_text())["levels"] == report["levels"]
    md = (out / f"timeline-{label}.md").read_text()
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 2]
    for lv in report["levels"]:
        assert lv["ok"] == lv["requests"] == 2, lv["errors"]
        assert stages <= set(lv["stages"]), lv["stages"].keys()
        assert f"## c={lv['concurrency']}:" in md and lv["busiest_stage"] in lv["stages"]
        for stage, row in lv["stages"].items():
            shares = [row["share_pct"][k] or 0.0 for k in SHARES]
            assert sum(shares) == pytest.approx(100.0, abs=0.5), (stage, row)  # setup is 0 while serving
            assert row["share_pct"]["gpu"] is None  # CPU: no GPU clock
            assert f"| {stage} |" in md
        for stage in stages:  # every stage of the speech path worked
            assert lv["stages"][stage]["steps"] > 0 and lv["stages"][stage]["busy_pct"] > 0, stage


def test_chat_timeline_of_a_tiny_qwen3_omni(tmp_path):
    from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
    from omni.models.qwen3_omni.graph import build

    ckpt = str(make_tiny(tmp_path / "tiny-a", seed=0, preset="tiny-a"))
    with LiveServer(mode="inline", build=lambda: build(ckpt, threads=1)) as srv:
        report = timeline.run(["--url", srv.url, "--family", "omni", "--concurrency", "1,2", "--requests", "2",
                               "--warmup", "1", "--max-tokens", "4", "--audio-tokens", "6", "--out-dir", str(tmp_path)])
    _check(report, tmp_path, "omni", {"thinker.0", "talker.0", "code2wav.0"})
    talker = report["levels"][1]["stages"]["talker.0"]
    assert talker["rows_per_step"] >= 1.0  # frames per engine step


def test_speech_timeline_of_a_tiny_qwen3_tts(tmp_path):
    from omni.models.qwen3_tts.checkpoint.make_tiny import make_tiny
    from omni.models.qwen3_tts.graph import build

    ckpt = str(make_tiny(tmp_path / "tts", kind="custom_voice", preset="tiny-a", seed=0))
    with LiveServer(mode="inline", build=lambda: build(ckpt, threads=1)) as srv:
        report = timeline.run(["--url", srv.url, "--family", "tts", "--concurrency", "1,2", "--requests", "2",
                               "--warmup", "0", "--frames", "6", "--out-dir", str(tmp_path), "--label", "tts-tiny"])
    _check(report, tmp_path, "tts-tiny", {"talker.0", "codec.0"})
