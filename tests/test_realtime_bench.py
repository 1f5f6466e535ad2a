"""bench/realtime.py against omnid serving a tiny Qwen3-Omni (the fixture of tests/test_realtime.py):
one session of three spoken turns found by the server's own VAD, the report's figures, and the
prefix cache seen through /metrics around each turn: turn 1 of a fresh server finds nothing, a later
turn finds the conversation before it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from test_realtime import server  # noqa: F401  (the module's tiny Qwen3-Omni omnid)

pytest.importorskip("silero_vad")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import realtime  # noqa: E402


@pytest.fixture(scope="module")
def bench(server, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("rt-bench")
    out, md = tmp / "rt.json", tmp / "rt.md"
    report = realtime.run(["--url", server.url, "--sessions", "1", "--cold", "", "--warmup-turns", "0", "--turns", "3",
                           "--pace", "fast", "--gap-s", "0.1", "--max-tokens", "4", "--audio-tokens", "6",
                           "--out", str(out), "--md", str(md)])
    return report, out, md


def test_three_spoken_turns_reported_and_a_later_turn_hits_the_prefix_cache(bench):
    report, out, md = bench
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    level = report["levels"][0]
    assert level["phase"] == "warm" and level["sessions"] == 1
    assert level["turns_ok"] == level["turns_planned"] == 3 and level["errors"] == {}, level["errors"]
    assert level["vad_split_turns"] == 0 and level["audio_out_s"] > 0
    # the server's own turn detection (nothing sent), as the session reported it
    assert report["config"]["turn_detection_sent"] is None
    assert report["config"]["turn_detection"]["silence_duration_ms"] == 500
    rows = level["sessions_detail"][0]["turns"]
    for row in rows:
        assert row["ok"] and row["detections"] == row["responses"] == 1
        # end of speech < speech_stopped < committed < first audio
        assert row["eos_to_audio_ms"] >= row["stopped_to_audio_ms"] >= row["committed_to_audio_ms"] > 0
        assert row["eos_to_stopped_ms"] > 0 and row["audio_s"] > 0
    for turn in level["per_turn"]:
        assert turn["ok"] == 1 and turn["eos_to_audio_ms"]["p50"] == rows[turn["turn"] - 1]["eos_to_audio_ms"]
    assert rows[0]["input_tokens"] < rows[1]["input_tokens"] < rows[2]["input_tokens"]  # the conversation grows
    assert level["turn_last"]["turn"] == 3
    ratio = level["last_over_first_p50"]["eos_to_audio_ms"]
    assert ratio == round(rows[2]["eos_to_audio_ms"] / rows[0]["eos_to_audio_ms"], 3)
    # the prefix cache: a fresh server's first turn finds nothing; turn 3 reuses turn 2's prompt
    first, third = (r["prefix_cache"]["thinker.0"] for r in (rows[0], rows[2]))
    assert first["hit_tokens"] == 0 and first["queried_tokens"] == rows[0]["input_tokens"]
    assert third["queried_tokens"] == rows[2]["input_tokens"]
    assert third["hit_rate"] > 0 and third["hit_tokens"] >= rows[1]["input_tokens"] // 2
    whole = level["prefix_cache"]["thinker.0"]
    assert whole["queried_tokens"] == sum(r["input_tokens"] for r in rows) and whole["hit_rate"] > 0
    text = md.read_text()
    assert "the server's default, what users get" in text and "| warm | 1 | 3/3 |" in text
    commit_row = text.split("Commit -> first audio p50/p90")[1].split("| warm | 1 | ")[1].split("\n")[0]
    assert commit_row.count("/") == 3 and "–" not in commit_row  # p50/p90 at each of the 3 turns


def test_manual_commit_reports_commit_to_audio_and_the_audio_encoders_cache(server, tmp_path):  # noqa: F811
    md = tmp_path / "manual.md"
    report = realtime.run(["--url", server.url, "--sessions", "1", "--cold", "", "--warmup-turns", "0", "--turns", "3",
                           "--pace", "fast", "--gap-s", "0.1", "--max-tokens", "4", "--audio-tokens", "6",
                           "--commit", "manual", "--md", str(md)])
    (level,) = report["levels"]
    assert level["commit"] == "manual" and level["turns_ok"] == 3, level["errors"]
    assert level["turn_detection"] is None  # the session reported turn detection off
    for row in level["sessions_detail"][0]["turns"]:
        assert row["detections"] == 0 and row["responses"] == 1
        assert row["eos_to_audio_ms"] >= row["commit_sent_to_audio_ms"] >= row["committed_to_audio_ms"] > 0
    # each turn re-sends the conversation: clip 1 is found encoded at turns 2 and 3, clip 2 at turn 3
    (audio,) = [v for k, v in level["encoder_cache"].items() if k.startswith("audio_encoder")]
    assert audio["hits"] == 3 and audio["encoded"] == 3 and audio["hit_rate"] == 0.5
    text = md.read_text()
    assert "| warm manual | 1 | 3/3 |" in text and "audio_encoder.0 50%" in text
    assert "manual commit, 1 session(s): worst turn's commit -> first audio p50" in text
