"""bench/serve.py against a live omnid on a tiny Qwen3-Omni: the report's fields are there and its
counts add up (fixed output lengths through ignore_eos). No timed asserts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from omni.layers.codec.wave_decoder import samples_for
from omni.models.qwen3_omni.config import load_config
from omni.models.qwen3_omni.graph import build
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from test_api_support import LiveServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import serve as bench_serve  # noqa: E402

pytest.importorskip("aiohttp")
TEXT, FRAMES = 5, 12


def TinyQwenServer(ckpt: str) -> LiveServer:
    return LiveServer(mode="inline", build=lambda: build(ckpt, threads=1))


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
    ])  # default: one cold level (c=1) before the warm-up, then the warm sweep
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert png.stat().st_size > 1000 and "| concurrency |" in md.read_text()
    assert report["config"]["model"] == server.info.id and report["command"].startswith("python bench/serve.py")
    cfg = load_config(ckpt).code2wav
    # talker max_tokens N -> N - 1 codec frames (no frame is computed for the last allowed token)
    want_audio_s = samples_for(cfg, FRAMES - 1) / cfg.sample_rate
    assert [(lv["phase"], lv["concurrency"]) for lv in report["levels"]] == [("cold", 1), ("warm", 1), ("warm", 3)]
    assert report["config"]["temperature"] is None and report["config"]["sampling"] == "server default"
    assert "| cold | 1 |" in md.read_text() and "| warm | 3 |" in md.read_text()
    for lv in report["levels"]:
        first = lv["first_request"]
        assert first["index"] == min(r["index"] for r in lv["rows"]) and first["ok"]
        assert first["ttfa_ms"] <= first["e2e_ms"] and first["rtf"] > 0
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
    assert sorted(r["index"] for lv in report["levels"] for r in lv["rows"]) == list(range(9))


def _workload(**kw):
    base = dict(url="u", model="m", prompts=["p"], max_tokens=5, audio_tokens=7, modalities=["text", "audio"],
                voice=None, ignore_eos=True, temperature=None, omni_ext=True, sample_rate=24000, timeout_s=1.0)
    return bench_serve.Workload(**{**base, **kw})


def test_default_body_sends_no_sampling_only_output_lengths():
    """What users get: no temperature for the text or the talker; output lengths stay fixed."""
    body = _workload().body(0)
    assert "temperature" not in body and body["max_tokens"] == 5 and body["ignore_eos"] is True
    assert body["stage_sampling"] == {"talker": {"max_tokens": 7, "ignore_eos": True}}
    greedy = _workload(temperature=0.0).body(0)
    assert greedy["temperature"] == 0.0 and greedy["stage_sampling"]["talker"]["temperature"] == 0.0


def test_cli_defaults_are_the_server_sampling_and_a_cold_level():
    args = bench_serve.build_parser().parse_args([])
    assert args.temperature is None and not args.greedy and args.cold == "1"
    assert args.concurrency == "1,4,16,32,64" and args.ignore_eos


def test_greedy_run_sends_temperature_zero_to_every_stage(server):
    seen = []
    real = bench_serve.Workload.body

    def spy(self, i):
        seen.append(real(self, i))
        return seen[-1]

    bench_serve.Workload.body = spy
    try:
        report = bench_serve.run(["--url", server.url, "--concurrency", "1", "--cold", "", "--requests", "1",
                                  "--warmup", "0", "--greedy", "--max-tokens", "3", "--audio-tokens", "4"])
    finally:
        bench_serve.Workload.body = real
    assert report["config"]["sampling"] == "greedy" and [lv["phase"] for lv in report["levels"]] == ["warm"]
    assert seen and all(b["temperature"] == 0.0 and b["stage_sampling"]["talker"]["temperature"] == 0.0 for b in seen)


def test_closed_loop_deadline_keeps_what_ended():
    import asyncio

    async def one(i):
        await asyncio.sleep(0.05)
        return {"index": i}

    rows, wall = asyncio.run(bench_serve.closed_loop(one, 2, 100, deadline_s=0.12))
    assert 2 <= len(rows) < 100 and [r["index"] for r in rows] == list(range(len(rows)))


def test_failures_are_counted_not_raised(server):
    report = bench_serve.run([
        "--url", server.url, "--model", "no-such-model", "--concurrency", "2", "--cold", "", "--requests", "3",
        "--warmup", "0", "--modalities", "text",
    ])
    (lv,) = report["levels"]
    assert lv["requests"] == 3 and lv["ok"] == 0 and lv["failed"] == 3
    assert sum(lv["errors"].values()) == 3 and all("HTTP 404" in e for e in lv["errors"])
    assert lv["e2e_ms"] is None and lv["output_tokens"] == 0


def test_text_only_has_no_audio_figures(server):
    report = bench_serve.run([
        "--url", server.url, "--concurrency", "2", "--cold", "", "--requests", "2", "--warmup", "0",
        "--modalities", "text", "--max-tokens", "4",
    ])
    (lv,) = report["levels"]
    assert lv["ok"] == 2 and lv["output_tokens"] == 8
    assert lv["ttfa_ms"] is None and lv["rtf"] is None and lv["audio_s"] == 0


# ---- bench/profile_decode.py, bench/gpu_suite.py, bench/talker_parity_gpu.py (CPU dry runs) ----------------

import profile_trace  # noqa: E402


def _x(name, ts, dur, cat="kernel", **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}


def test_trace_summary_counts_busy_time_and_categories():
    """Two annotated steps; kernels launched inside `cat:` scopes (linked by correlation id)."""
    eager = [
        _x("cat:attention", 0, 100, "user_annotation"), _x("cat:MoE experts", 100, 100, "user_annotation"),
        _x("cudaLaunchKernel", 10, 1, "cuda_runtime", correlation=1),
        _x("cudaLaunchKernel", 110, 1, "cuda_runtime", correlation=2),
        _x("cudaLaunchKernel", 120, 1, "cuda_runtime", correlation=3),
        _x("cudaLaunchKernel", 300, 1, "cuda_runtime", correlation=4),  # outside every scope
        _x("flash_fwd", 20, 5, correlation=1), _x("nvjet_gemm", 130, 7, correlation=2),
        _x("radix_sort", 140, 3, correlation=3), _x("argmax_kernel", 310, 2, correlation=4),
    ]
    shares = profile_trace.attribution(eager)
    assert shares == {"flash_fwd": {"attention": 5.0}, "nvjet_gemm": {"MoE GEMMs": 7.0},
                      "radix_sort": {"MoE sort/index/act": 3.0}, "argmax_kernel": {"sampling/engine": 2.0}}
    graph = [
        {"ph": "M", "name": "process_name", "pid": 1},
        _x("decode_step0", 1000, 100, "user_annotation"), _x("decode_step1", 1100, 50, "user_annotation"),
        _x("flash_fwd", 1010, 10), _x("nvjet_gemm", 1015, 10), _x("unknown_thing", 1040, 4),  # overlap: busy 15 + 4
        _x("flash_fwd", 1110, 10), _x("nvjet_gemm", 1120, 20), _x("Memcpy HtoD", 1142, 2, "gpu_memcpy"),
    ]
    s = profile_trace.summarize(graph, "decode_step", shares)
    assert s["steps"] == 2 and s["wall_us_per_step"] == 75.0
    assert s["device_busy_us_per_step"] == (19 + 32) / 2 and s["host_only_us_per_step"] == 75.0 - 25.5
    assert s["kernels_per_step"] == 3.0 and s["kernel_us_per_step"] == 56 / 2
    top = {k["name"]: k for k in s["top_kernels"]}
    assert top["nvjet_gemm"]["us_per_step"] == 15.0 and top["nvjet_gemm"]["share"] == round(30 / 56, 4)
    assert top["nvjet_gemm"]["category"] == "MoE GEMMs" and top["flash_fwd"]["count_per_step"] == 1.0
    assert s["categories_us_per_step"] == {"MoE GEMMs": 15.0, "attention": 10.0, "other": 2.0, "copies": 1.0}
    assert s["groups_us_per_step"]["MoE GEMMs"] == 15.0 and s["groups_us_per_step"]["copies/other"] == 3.0


def test_trace_window_keeps_only_the_chosen_steps(tmp_path):
    events = [{"ph": "M", "name": "m"}, _x("a", 0, 10), _x("b", 50, 10), _x("c", 200, 10)]
    profile_trace.write_window(events, (45, 100), tmp_path / "t.json.gz")
    assert [e["name"] for e in profile_trace.load(tmp_path / "t.json.gz")] == ["m", "b"]


def test_profile_decode_dry_run_on_cpu(tmp_path):
    import profile_decode

    result = profile_decode.main(["--one", "--scaled", "--device", "cpu", "--out-dir", str(tmp_path), "--batch", "1,2",
                                  "--steps", "3", "--timed", "2", "--warmup", "1"])
    rows = result["rows"]
    assert [r["batch"] for r in rows] == [1, 2] and not any("error" in r for r in rows), rows
    for r in rows:
        assert r["steps"] == 3 and r["kernels_per_step"] > 0 and r["wall_us_per_step"] > 0
        assert r["graph_steps"] >= 3  # the fixed-shape (graph) decode path ran
        assert {"attention", "MoE GEMMs", "norms/rope/elementwise"} <= {
            g for g, us in r["groups_us_per_step"].items() if us > 0}
        assert r["roofline"]["bytes_per_step"] > r["roofline"]["expert_bytes"] > 0
        assert (tmp_path / r["trace"]).stat().st_size == r["trace_bytes"] > 0
    assert rows[1]["roofline"]["experts_touched_per_layer"] > rows[0]["roofline"]["experts_touched_per_layer"]
    assert "| default | 2 |" in profile_decode.markdown({"date": "d", "command": "c", "backend_env_supported": False,
                                                        "seconds": 1, "backends": [result]})


def test_suite_plan_cold_first_then_warm_then_greedy(tmp_path):
    """The suite's serve phases: the cold levels on the fresh server (no warm-up), the warm-up pass,
    the warm sweep 1,4,16,32,64, then the greedy extra line; no phase sends a temperature but greedy."""
    import gpu_suite

    suite = gpu_suite.Suite(gpu_suite.build_parser().parse_args(["--out-dir", str(tmp_path), "--omnid-arg=--mps",
                                                                 "--omnid-arg", "x"]))
    names = [name for name, _, _ in suite.plan()]
    assert names == ["serve_cold_c1", "serve_cold_c16", "serve_prewarm", "serve_c1", "serve_c4", "serve_c16",
                     "serve_c32", "serve_c64", "serve_prewarm_greedy", "serve_greedy_c1", "serve_greedy_c16"]
    assert suite.measured() == [n for n in names if "prewarm" not in n]
    args = {name: bench_serve.build_parser().parse_args(cmd[2:]) for name, cmd, _ in suite.plan()}
    for name, a in args.items():
        assert a.cold == "" and (a.greedy == ("greedy" in name)) and a.temperature is None
        assert a.phase == ("cold" if "cold" in name else "prewarm" if "prewarm" in name else
                           "greedy" if "greedy" in name else "warm")
        assert a.warmup == 0 and a.ignore_eos
    assert suite.args.omnid_arg == ["--mps", "x"]
    none = gpu_suite.Suite(gpu_suite.build_parser().parse_args(["--out-dir", str(tmp_path), "--cold", "",
                                                                "--greedy-levels", "", "--no-prewarm"]))
    assert [n for n, _, _ in none.plan()][:2] == ["serve_c1", "serve_c4"]
    assert bench_serve.build_parser().parse_args(none.plan()[0][1][2:]).warmup == 2  # no pre-warm pass: 2 requests


def test_suite_report_rows_keep_cold_and_warm_apart():
    import suite_report

    def lv(phase, c, ttfa, first):
        return {"phase": phase, "concurrency": c, "ok": 2, "requests": 2, "ttfa_ms": {"p50": ttfa},
                "rtf": {"p50": ttfa / 1000}, "e2e_ms": {"p50": 2 * ttfa}, "throughput": {},
                "first_request": {"ttfa_ms": first, "e2e_ms": 2 * first, "rtf": first / 1000}}

    omni = suite_report.merge_levels([{"command": "a", "levels": [lv("cold", 1, 300, 900)]},
                                      {"command": "b", "levels": [lv("warm", 1, 100, 100)]},
                                      {"command": "c", "levels": [lv("greedy", 1, 50, 50)]}])
    rows = suite_report.comparison(omni, None)
    assert [(r["phase"], r["concurrency"]) for r in rows] == [("cold", 1), ("warm", 1), ("greedy", 1)]
    (cw,) = suite_report.cold_vs_warm(omni)
    assert cw["TTFA p50 cold/warm"] == 3.0 and cw["first TTFA / warm p50"] == 9.0 and cw["first E2E / warm p50"] == 9.0
    rep = {"model": "m", "date": "d", "gpu": "g", "machine": {}, "seconds": 1, "phases": [], "commands": [],
           "workload": {"prompt_set": "short", "max_tokens": 1, "audio_tokens": 1, "cold": [1], "concurrency": [1],
                        "greedy": [1], "sampling": "server default"},
           "comparison": rows, "cold_vs_warm": [cw], "omni": None, "hf": None, "omnid_args": ["--mps"]}
    md = suite_report.markdown(rep)
    assert "| cold | 1 |" in md and "| greedy | 1 |" in md and "Fresh server (cold)" in md and "`--mps`" in md


def test_suite_comparison_speedups():
    import suite_report

    def level(c, e2e, ttfa, audio_rate):
        return {"concurrency": c, "ok": 2, "requests": 2, "e2e_ms": {"p50": e2e}, "ttfa_ms": {"p50": ttfa},
                "rtf": {"p50": e2e / 5000}, "throughput": {"audio_s_per_s": audio_rate}}

    omni = suite_report.merge_levels([{"command": "a", "levels": [level(1, 2000, 100, 2.5)]}, None,
                                      {"command": "b", "levels": [level(4, 4000, 400, 5.0)]}])
    assert [lv["concurrency"] for lv in omni["levels"]] == [1, 4] and omni["commands"] == ["a", "b"]
    hf = {"levels": [level(1, 16000, 16000, 0.3125)]}
    rows = suite_report.comparison(omni, hf)
    assert rows[0]["speedup E2E p50"] == 8.0 and rows[0]["speedup TTFA p50"] == 160.0
    assert rows[0]["speedup audio throughput"] == 8.0 and rows[0]["speedup RTF p50"] == 8.0
    assert rows[1]["hf E2E p50 ms"] is None and rows[1]["speedup E2E p50"] is None


def test_suite_omnid_overrides_are_valid_for_the_qwen3_graph(tmp_path):
    """Every --set flag the suite gives omnid names a real stage field (GraphError otherwise)."""
    import gpu_suite

    from omni.config import apply_overrides, parse_set_flags
    from omni.models.qwen3_omni.checkpoint.presets_full import scaled_config, write_random_model_dir

    args = gpu_suite.build_parser().parse_args(["--out-dir", str(tmp_path / "out"), "--concurrency", "1,48"])
    args.device = "cuda"
    sets = gpu_suite.Suite(args).omnid_sets()
    graph, _ = build(str(write_random_model_dir(tmp_path / "m", scaled_config())))
    apply_overrides(graph, parse_set_flags(sets))
    for name in gpu_suite.GPU_STAGES:
        assert graph.stage(name).device == "cuda" and graph.stage(name).args["dtype"] == "bfloat16"
    for name in ("thinker", "talker"):
        a = graph.stage(name).args
        assert a["cuda_graphs"] is True and a["max_num_seqs"] == 48 and a["num_blocks"] * 16 >= 48 * 100
    assert graph.stage("preprocess").device == "cpu"


def test_kill_group_ends_the_child_and_its_children(tmp_path):
    import os
    import subprocess

    from suite_support import kill_group

    pids = tmp_path / "pids"
    proc = subprocess.Popen(["sh", "-c", f"trap '' INT; sleep 60 & echo $! > {pids}; wait"], start_new_session=True)
    import time

    for _ in range(100):
        if pids.exists() and pids.read_text().strip():
            break
        time.sleep(0.05)
    grandchild = int(pids.read_text())
    status = kill_group(proc, grace=0.5, first=2)  # SIGINT is ignored: SIGKILL must follow
    assert status.startswith("killed") and proc.returncode is not None
    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:  # a zombie (killed, not reaped yet) is dead
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (ProcessLookupError, FileNotFoundError):
            return False

    for _ in range(100):
        if not alive(grandchild):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the grandchild outlived its group")


def test_talker_parity_tells_a_near_tie_from_a_bug():
    import numpy as np
    import torch
    from talker_parity_gpu import Recorder, compare, first_difference

    ref = np.array([[5, 1], [6, 2], [7, 3]])
    got = np.array([[5, 1], [6, 4], [7, 3]])
    assert first_difference(ref, ref) is None and first_difference(ref, got) == (1, 1)
    assert first_difference(ref, ref[:2]) == (2, 0)

    def recorder(rows0, rows1):
        rec = Recorder.__new__(Recorder)
        rec.group0, rec.rest = [torch.tensor(r) for r in rows0], [torch.tensor(r) for r in rows1]
        return rec

    base0 = [[0.0] * 5 + [1.0, 0, 0], [0.0] * 6 + [1.0, 0], [0.0] * 7 + [1.0]]
    rest = [[0.0, 1.0, 0, 0, 0], [0, 0, 1.0, 0, 0.999], [0, 0, 0, 1.0, 0]]
    noisy0 = [[0.0] * 5 + [1.0 - 5e-4, 0, 0]] + base0[1:]  # a near-tie needs noise before it as large
    tie = compare(ref, recorder(base0, rest), got, recorder(noisy0, [rest[0], [0, 0, 0.999, 0, 1.0], rest[2]]))
    assert tie["first_diff"] == {"frame": 1, "group": 1} and tie["cpu_code"] == 2 and tie["device_code"] == 4
    assert abs(tie["cpu_margin_top1_top2"] - 0.001) < 1e-6 and tie["verdict"].startswith("near-tie")
    quiet = compare(ref, recorder(base0, rest), got, recorder(base0, [rest[0], [0, 0, 0.999, 0, 1.0], rest[2]]))
    assert quiet["verdict"].startswith("bug")  # the same flip with nothing differing before it
    far = [[0, 0, 1.0, 0, -5.0]]
    bug = compare(ref, recorder(base0, [rest[0], far[0], rest[2]]), got, recorder(base0, [rest[0], far[0], rest[2]]))
    assert bug["cpu_gap_to_device_choice"] == 6.0 and bug["verdict"].startswith("bug")
    same = compare(ref, recorder(base0, rest), ref, recorder(base0, rest))
    assert same["equal"] and same["max_logit_diff_before"] == 0.0


@pytest.mark.slow
def test_gpu_suite_scaled_end_to_end_on_cpu(tmp_path):
    """The whole orchestration at test sizes (~40 s): random model dir, omnid (6 stage processes),
    warm-up, one bench/serve.py run per level, omnid stopped, transformers baseline, the report."""
    import gpu_suite

    rep = gpu_suite.main(["--scaled", "--out-dir", str(tmp_path), "--hf-requests", "1", "--budget-s", "260",
                          "--probe-first", "1"])
    assert [(p["name"], p["status"]) for p in rep["phases"]] == [
        ("omnid_start", "ok"), ("serve_probe_0", "ok"), ("serve_cold_c1", "ok"), ("serve_prewarm", "ok"), ("serve_c1", "ok"),
        ("serve_c2", "ok"), ("serve_prewarm_greedy", "ok"), ("serve_greedy_c1", "ok"),
        ("omnid_stop", "stopped (rc 0)"), ("hf_baseline", "ok")]
    assert [(r["phase"], r["concurrency"]) for r in rep["comparison"]] == [
        ("cold", 1), ("warm", 1), ("warm", 2), ("greedy", 1)]
    for row in rep["comparison"]:
        assert row["omni_ok"] == "4/4" and row["speedup E2E p50"] and row["speedup audio throughput"]
        assert row["omni TTFA p50 ms"] <= row["omni E2E p50 ms"]
    assert rep["omni"]["levels"][0]["output_tokens"] == 4 * 4  # --scaled: 4 thinker tokens per request
    assert [r["concurrency"] for r in rep["cold_vs_warm"]] == [1] and rep["cold_vs_warm"][0]["TTFA p50 cold/warm"]
    assert json.loads((tmp_path / "suite.json").read_text())["comparison"] == rep["comparison"]
    md = (tmp_path / "suite.md").read_text()
    assert (tmp_path / "omni_vs_hf.png").stat().st_size > 1000 and "speedup" in md and "| cold | 1 |" in md
    serve_cmds = [c for c in rep["commands"] if "bench/serve.py" in c]
    assert len(serve_cmds) == 7 and sum("--greedy" in c for c in serve_cmds) == 2
    probe = rep["cold_probe"][0]  # the first request's time per stage, from the stage clocks
    assert probe["ttfa_ms"] > 0 and probe["stage_steps"]["thinker.0"] >= 1 and probe["stage_seconds"]["talker.0"] > 0
    assert not any("--temperature" in c for c in serve_cmds)
