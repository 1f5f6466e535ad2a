"""bench/serve.py against a live omnid on a tiny Qwen3-Omni: the report's fields are there and its
counts add up (fixed output lengths through ignore_eos). No timed asserts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from omni.api.app import build_app
from omni.api.server import HttpServer
from omni.kernel.kernel import Kernel
from omni.models.qwen3_omni.code2wav import samples_for
from omni.models.qwen3_omni.config import load_config
from omni.models.qwen3_omni.graph import build
from omni.models.qwen3_omni.make_tiny import make_tiny
from test_api_support import LiveServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import serve as bench_serve  # noqa: E402

pytest.importorskip("aiohttp")
TEXT, FRAMES = 5, 12


class TinyQwenServer(LiveServer):
    def __init__(self, ckpt: str) -> None:
        super().__init__(mode="inline")
        self.ckpt = ckpt

    async def _start(self) -> None:
        graph, self.info = build(self.ckpt, threads=1)
        self.kernel = Kernel(graph, mode="inline")
        await self.kernel.start()
        app = build_app(self.kernel, self.info, [s.name for s in graph.stages], self.config)
        self.servers.append(await HttpServer(app, "127.0.0.1", 0).start())


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(make_tiny(tmp_path_factory.mktemp("tiny-a"), seed=0, preset="tiny-a"))


@pytest.fixture(scope="module")
def server(ckpt):
    with TinyQwenServer(ckpt) as srv:
        yield srv


def test_sweep_report_counts_add_up(server, ckpt, tmp_path):
    out, png, md = tmp_path / "r.json", tmp_path / "r.png", tmp_path / "r.md"
    report = bench_serve.run([
        "--url", server.url, "--concurrency", "1,3", "--requests", "3", "--warmup", "1",
        "--max-tokens", str(TEXT), "--audio-tokens", str(FRAMES), "--rows",
        "--out", str(out), "--plot", str(png), "--md", str(md), "--label", "omni-tiny",
    ])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert png.stat().st_size > 1000 and "| concurrency |" in md.read_text()
    assert report["config"]["model"] == server.info.id and report["command"].startswith("python bench/serve.py")
    cfg = load_config(ckpt).code2wav
    # talker max_tokens N -> N - 1 codec frames (no frame is computed for the last allowed token)
    want_audio_s = samples_for(cfg, FRAMES - 1) / cfg.sample_rate
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 3]
    for lv in report["levels"]:
        assert lv["requests"] == 3 and lv["ok"] == 3 and lv["failed"] == 0 and not lv["errors"], lv["errors"]
        assert lv["output_tokens"] == 3 * TEXT  # ignore_eos: exactly max_tokens each
        for key in ("ttft_ms", "tpot_ms", "ttfa_ms", "e2e_ms", "rtf"):
            assert set(lv[key]) == {"mean", "p50", "p90", "p99"}
            assert lv[key]["p50"] <= lv[key]["p90"] <= lv[key]["p99"]
        t = lv["throughput"]
        assert t["requests_per_s"] == pytest.approx(3 / lv["wall_s"], rel=1e-2)
        assert t["output_tokens_per_s"] == pytest.approx(3 * TEXT / lv["wall_s"], rel=1e-2)
        for row in lv["rows"]:
            assert row["ok"] and row["output_tokens"] == TEXT
            # every frame's audio arrives (pcm16: the same sample count as the model's waveform)
            assert row["audio_s"] == pytest.approx(want_audio_s, abs=1 / cfg.sample_rate)
            assert row["ttft_s"] <= row["latency_s"] and row["ttfa_s"] <= row["latency_s"]
        assert lv["audio_s"] == pytest.approx(3 * want_audio_s, abs=1e-2)
    assert sorted(r["index"] for lv in report["levels"] for r in lv["rows"]) == list(range(6))


def test_failures_are_counted_not_raised(server):
    report = bench_serve.run([
        "--url", server.url, "--model", "no-such-model", "--concurrency", "2", "--requests", "3",
        "--warmup", "0", "--modalities", "text",
    ])
    (lv,) = report["levels"]
    assert lv["requests"] == 3 and lv["ok"] == 0 and lv["failed"] == 3
    assert sum(lv["errors"].values()) == 3 and all("HTTP 404" in e for e in lv["errors"])
    assert lv["e2e_ms"] is None and lv["output_tokens"] == 0


def test_text_only_has_no_audio_figures(server):
    report = bench_serve.run([
        "--url", server.url, "--concurrency", "2", "--requests", "2", "--warmup", "0",
        "--modalities", "text", "--max-tokens", "4",
    ])
    (lv,) = report["levels"]
    assert lv["ok"] == 2 and lv["output_tokens"] == 8
    assert lv["ttfa_ms"] is None and lv["rtf"] is None and lv["audio_s"] == 0
