"""The equal-work comparison's pieces on CPU (the GPU run is bench/h200/issue12.sh): the reduced-depth
text checkpoint that both engines load, omni's and SGLang's load drivers (SGLang through a stand-in
engine that streams in SGLang's format), the router replay against the engine's own routing, and
the experts-hit measure. No timed asserts."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import equal_work_support as ews  # noqa: E402
from omni.models.qwen3_omni.checkpoint.text_checkpoint import (MARKER, load_text_thinker, text_config,  # noqa: E402
                                                    write_text_checkpoint)
from omni.models.weights import checkpoint_files  # noqa: E402

SMALL = {**text_config(3, scaled=True), "vocab_size": 4096}  # test widths, 3 layers, a small vocabulary


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(0)
    return write_text_checkpoint(tmp_path_factory.mktemp("text-ckpt"), seed=3, std=0.2, device="cpu", text=SMALL)


def _omni_greedy(model, prompts, n):
    from omni.stages.ar.config import EngineConfig
    from omni.stages.ar.engine import AREngine
    from omni.stages.ar.sequence import SamplingParams

    engine = AREngine(model, EngineConfig(num_blocks=64, max_num_seqs=4, max_model_len=128))
    return engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))


def test_checkpoint_layout_and_marker(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["num_hidden_layers"] == 3
    assert cfg["num_experts"] == SMALL["num_experts"] and cfg["vocab_size"] == 4096
    names = checkpoint_files(ckpt)  # through the index, every shard present
    assert len({p.name for p in names.values()}) == 4  # one shard per layer + embedding/norm/lm_head
    assert "model.layers.2.mlp.experts.7.down_proj.weight" in names and "lm_head.weight" in names
    assert "model.layers.0.mlp.gate.weight" in names and "model.layers.0.self_attn.q_norm.weight" in names
    marker = json.loads((ckpt / MARKER).read_text())
    assert marker["seed"] == 3 and marker["layers"] == 3 and marker["params"] > 0


def test_full_width_config_is_the_published_thinker():
    full = text_config(8)
    assert (full["hidden_size"], full["num_experts"], full["num_experts_per_tok"], full["moe_intermediate_size"],
            full["num_attention_heads"], full["num_key_value_heads"], full["head_dim"], full["num_hidden_layers"]) == (
        2048, 128, 8, 768, 32, 4, 128, 8)


def test_seed_reproduces_the_weights(ckpt, tmp_path):
    again = write_text_checkpoint(tmp_path / "again", seed=3, std=0.2, device="cpu", text=SMALL)
    a, b = load_text_thinker(ckpt), load_text_thinker(again)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


def test_transformers_and_omni_load_the_same_model(ckpt):
    """transformers' Qwen3MoeForCausalLM (the layout SGLang loads) and omni's engine on the tensors
    omni's loader made of the same directory give the same greedy tokens (float32)."""
    transformers = pytest.importorskip("transformers")
    torch.set_num_threads(1)
    hf = transformers.Qwen3MoeForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    model = load_text_thinker(ckpt, "cpu", torch.float32)
    prompts = [ews.distinct_prompt(i, 12, seed=1, vocab=4096) for i in range(3)]
    ours = _omni_greedy(model, prompts, 10)
    for prompt, got in zip(prompts, ours):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                              max_new_tokens=10, do_sample=False, eos_token_id=None)[0, len(prompt):].tolist()
        assert got == ref
    assert len({tuple(o) for o in ours}) == 3  # distinct prompts, distinct streams


def test_distinct_prompts_are_distinct_and_reproducible():
    ps = [ews.distinct_prompt(i, 32, seed=0) for i in range(64)]
    assert len({tuple(p) for p in ps}) == 64 and ps[5] == ews.distinct_prompt(5, 32, seed=0)
    assert max(max(p) for p in ps) < ews.SPECIAL_FLOOR and ews.distinct_prompt(5, 32, seed=1) != ps[5]


def test_co_running_batches_and_hits():
    # two requests decoding together (tokens at 1, 2, 3 and 1.5, 2.5, 3.5), a third alone later
    level = {"requests": [{"index": 0, "output_ids": [1, 2, 3], "t_tokens": [1.0, 2.0, 3.0]},
                          {"index": 1, "output_ids": [4, 5, 6], "t_tokens": [1.5, 2.5, 3.5]},
                          {"index": 2, "output_ids": [7, 8], "t_tokens": [5.0, 6.0]}]}
    steps = ews.co_running(level, samples=10)
    assert steps[0] == [(0, 0)] and [(0, 1), (1, 0)] in steps and [(2, 0)] in steps
    P, L, K, E = 2, 2, 2, 8
    topk = {0: np.zeros((P + 2, L, K), np.int16), 1: np.zeros((P + 2, L, K), np.int16),
            2: np.zeros((P + 1, L, K), np.int16)}
    topk[0][P + 1] = [[0, 1], [0, 1]]
    topk[1][P + 0] = [[2, 3], [0, 1]]
    topk[0][P + 0] = [[0, 1], [0, 1]]
    hits = ews.hits_per_step(level, topk, P, E, samples=10)
    # instants 1.25, 1.75, ..., 5.75: batches r0 | r0 r1 | r0' r1 | r0' r1' | r1' | (none x3) | r2 | r2
    assert hits["steps_sampled"] == 7 and hits["batch_mean"] == round(10 / 7, 2)
    assert hits["hits_by_layer"] == [round(15 / 7, 2), round(11 / 7, 2)] and hits["hits_per_layer_mean"] == round(26 / 14, 2)
    assert ews.uniform_hits(16, 128, 8) == pytest.approx(82.4, abs=0.1)
    same = {"requests": [{"index": i, "output_ids": [5, 5]} for i in range(3)]}
    assert ews.stream_stats(same)["distinct_streams"] == 1


def test_replay_equals_the_engines_own_routing(ckpt):
    """The router replay of the tokens an engine produced gives the experts that engine's decode
    steps chose (omni's engine with the router tap on, eager float32 on CPU)."""
    import omni_engine_load
    from expert_hits import RouterTap, replay

    torch.set_num_threads(1)
    model = load_text_thinker(ckpt, "cpu", torch.float32)
    tap = RouterTap(model)
    from omni.stages.ar.engine import AREngine

    engine = AREngine(model, omni_engine_load.engine_config("cpu", [3], 8, 6, {}))
    prompt = lambda i: ews.distinct_prompt(i, 8, 0, 4096)  # noqa: E731
    rows, _, recs = omni_engine_load.closed_loop(engine, prompt, 6, 3, 3, 0)
    assert all(r["ok"] and r["output_tokens"] == 6 for r in rows)
    live = tap.per_request()  # what the engine's own steps routed, per rid
    seqs = {f"x{r['index']}": prompt(r["index"]) + r["output_ids"][:-1] for r in recs}
    fresh = load_text_thinker(ckpt, "cpu", torch.float32)
    again = replay(fresh, seqs, "cpu")
    for r in recs:
        got, want = again[f"x{r['index']}"], live[f"r{r['index']}"]
        assert got.shape == (8 + 5, 3, SMALL["num_experts_per_tok"])
        np.testing.assert_array_equal(np.sort(got, -1), np.sort(want[: len(got)], -1))


def test_omni_driver_report_and_records(ckpt, tmp_path):
    import omni_engine_load

    rep = omni_engine_load.main(["--model-path", str(ckpt), "--device", "cpu", "--concurrency", "1,3", "--requests",
                                 "4", "--max-tokens", "5", "--prompt-len", "6", "--out", str(tmp_path / "o.json"),
                                 "--tokens-out", str(tmp_path / "t.json")])
    assert [(lv["phase"], lv["concurrency"], lv["ok"]) for lv in rep["levels"]] == [("warm", 1, 4), ("warm", 3, 4)]
    assert all(lv["output_tokens"] == 20 and lv["tpot_ms"]["p50"] > 0 for lv in rep["levels"])
    rec = json.loads((tmp_path / "t.json").read_text())
    assert rec["engine"] == "omni" and rec["prompt_len"] == 6
    for lv in rec["levels"]:
        for r in lv["requests"]:
            assert len(r["output_ids"]) == 5 and r["t_tokens"] == sorted(r["t_tokens"]) and r["t_submit"] >= 0
    assert sorted(r["index"] for lv in rec["levels"] for r in lv["requests"]) == list(range(8))


class StandInEngine:
    """Streams like sglang.Engine: cumulative `output_ids`, sometimes two tokens per chunk."""

    def __init__(self, **kwargs) -> None:
        self.kwargs, self.prompts, self.shut = kwargs, [], False
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)

    async def async_generate(self, input_ids, sampling_params, stream):
        assert stream and sampling_params["ignore_eos"] and sampling_params["temperature"] == 0.0
        self.prompts.append(list(input_ids))
        return self._gen(list(input_ids), sampling_params["max_new_tokens"])

    async def _gen(self, prompt, n):
        outs = []
        while len(outs) < n:
            outs.append((sum(prompt) + 7 * len(outs)) % 97)
            if len(outs) % 3 and len(outs) < n:
                outs.append((sum(prompt) + 7 * len(outs)) % 97)
            await asyncio.sleep(0.001)
            yield {"output_ids": outs[:n], "meta_info": {}}

    def shutdown(self) -> None:
        self.shut = True


def test_sglang_driver_distinct_prompts_and_records(ckpt, tmp_path):
    import sglang_engine_load

    made = []

    def factory(**kw):
        made.append(StandInEngine(**kw))
        return made[-1]

    rep = sglang_engine_load.main(["--model-path", str(ckpt), "--concurrency", "1,4", "--requests", "5",
                                   "--max-tokens", "7", "--prompt-len", "6", "--seed", "2",
                                   "--out", str(tmp_path / "s.json"), "--tokens-out", str(tmp_path / "st.json")],
                                  engine_factory=factory)
    (engine,) = made
    assert engine.shut and engine.kwargs["load_format"] == "auto" and engine.kwargs["disable_radix_cache"]
    assert [(lv["phase"], lv["concurrency"], lv["ok"], lv["output_tokens"]) for lv in rep["levels"]] == [
        ("warm", 1, 5, 35), ("warm", 4, 5, 35)]
    measured = engine.prompts[-10:]  # after the warm-up requests
    assert measured == [ews.distinct_prompt(i, 6, 2, 4096) for i in range(10)]
    assert len(engine.prompts) == 10 + 1 + 4  # warm-up: each level once
    rec = json.loads((tmp_path / "st.json").read_text())
    for lv in rec["levels"]:
        for r in lv["requests"]:
            assert len(r["output_ids"]) == len(r["t_tokens"]) == 7 and r["t_tokens"] == sorted(r["t_tokens"])
    omni_like = {"levels": [{"phase": "warm", "requests": [dict(r) for r in rec["levels"][0]["requests"]]}]}
    omni_like["levels"][0]["requests"][0]["output_ids"] = [0] * 7
    agree = ews.agreement(omni_like, rec)
    assert agree["requests"] == 5 and agree["identical"] == 4 and agree["prefix_share_mean"] < 1.0


STAND_IN_SGLANG = """
import asyncio


class Engine:  # streams like sglang.Engine (cumulative output_ids); tokens from the prompt's sum
    def __init__(self, **kwargs):
        assert kwargs["load_format"] == "auto"
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)

    async def async_generate(self, input_ids, sampling_params, stream):
        return self._gen(list(input_ids), sampling_params["max_new_tokens"])

    async def _gen(self, prompt, n):
        outs = []
        for k in range(n):
            outs.append((sum(prompt) * 31 + 17 * k) % 4000)
            await asyncio.sleep(0.002)
            yield {"output_ids": list(outs), "meta_info": {}}

    def shutdown(self):
        pass
"""


@pytest.mark.slow
def test_equal_work_dry_run_on_cpu(tmp_path):
    """The orchestration at test sizes: checkpoint -> omni's load -> SGLang's load (a stand-in
    `sglang` package put on the path for that phase alone, as the GPU kit is) -> replay -> report."""
    import equal_work

    fake = tmp_path / "fake"
    (fake / "sglang").mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text(STAND_IN_SGLANG)
    rep = equal_work.main(["--out-dir", str(tmp_path / "out"), "--scaled", "--layers", "2", "--requests", "4",
                           "--max-tokens", "5", "--prompt-len", "8", "--budget-s", "240", "--sglang-path", str(fake)])
    assert [(p["name"], p["status"]) for p in rep["phases"]] == [
        ("checkpoint", "ok"), ("omni", "ok"), ("sglang", "ok"), ("experts", "ok")]
    assert [(r["engine"], r["concurrency"]) for r in rep["rows"]] == [
        ("omni", 1), ("sglang", 1), ("omni", 4), ("sglang", 4)]
    for r in rep["rows"]:
        assert r["ok"] == "4/4" and r["tpot_p50_ms"] > 0 and r["experts_hit_per_layer"] >= 2
        assert r["weight_read_floor_ms"] > 0 and r["distinct_streams"] == 4
    assert all(r["tpot_vs_sglang"] for r in rep["rows"] if r["engine"] == "omni")
    assert rep["token_agreement"]["requests"] == 8 and rep["engine_start"]["sglang_start_s"] is not None
    md = (tmp_path / "out" / "equal_work.md").read_text()
    assert "| omni | 4 |" in md and "| sglang | 4 |" in md


def test_issue12_script_builds_valid_commands(tmp_path):
    """bench/h200/issue12.sh (the lead's one device call) with DRY_RUN=1: every command it would run
    parses with its tool's own parser and carries the variant's omnid arguments and overrides."""
    import os
    import shlex
    import subprocess

    import equal_work
    import gpu_suite

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "DRY_RUN": "1", "R": str(tmp_path / "r"), "OUT": str(tmp_path / "out"),
           "SERVE_VARIANTS": "omni:;omni-mps:--mps --foo=1", "OMNID_SET": "talker.args.a=1 thinker.args.b=2",
           "SUITE_ARGS": "--concurrency 1,16 --greedy-levels=", "EQUAL_ARGS": "--layers 12", "SERVE_BUDGET": "400"}
    proc = subprocess.run(["bash", "bench/h200/issue12.sh"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    log = (tmp_path / "out" / "issue12.log").read_text()
    serve = [line.split("): ", 1)[1] for line in log.splitlines() if "] serve " in line and "): " in line]
    assert len(serve) == 2
    for line, label, extra in zip(serve, ["omni", "omni-mps"], [[], ["--mps", "--foo=1"]]):
        argv = shlex.split(line)
        assert argv[:2] == ["python3", "bench/gpu_suite.py"]
        args = gpu_suite.build_parser().parse_args(argv[2:])
        assert args.label == label and args.omnid_arg == extra and args.no_hf and args.budget_s == 200
        assert args.extra_set == ["talker.args.a=1", "thinker.args.b=2"]
        assert args.concurrency == "1,16" and args.greedy_levels == "" and args.cold is None  # suite default 1,16
    (eq,) = [line.split("): ", 1)[1] for line in log.splitlines() if "] equal work (" in line]
    argv = shlex.split(eq)
    args = equal_work.build_parser().parse_args(argv[2:])
    assert args.engines in ("omni", "omni,sglang") and args.layers == 12 and args.budget_s <= 225  # no SGLang kit here
    assert (tmp_path / "out" / "issue12.tgz").exists()


FAKE_INSTALL = """#!/usr/bin/env bash
# stand-in for the SGLang kit's install.sh: "installs" the part's packages into SGLKIT_TARGET
set -e
part=$(basename "${1%/}")
mkdir -p "$SGLKIT_TARGET"
sleep 2
cp -r "$1"/. "$SGLKIT_TARGET"/
touch "$SGLKIT_TARGET/.sglkit-part-$part"
for p in ${SGLKIT_REQUIRE:-}; do [ -f "$SGLKIT_TARGET/.sglkit-part-$p" ] || exit 3; done
"""


@pytest.mark.slow
@pytest.mark.parametrize("part_a", [True, False], ids=["after-call-1", "machine-recycled"])
def test_issue12_second_call_installs_kit_b_and_runs_both_engines(tmp_path, part_a):
    """The lead's second device call on CPU: kit part a installed by the first call, part b carried now;
    b installs in the background while omni's phases run, SGLang's phase waits for it and then runs
    (a stand-in sglang package stands for the kit's). On a recycled machine (no part a) SGLang's phase
    is skipped and says why; omni's rows stand."""
    import os
    import subprocess

    root = Path(__file__).resolve().parent.parent
    work = tmp_path / "repo"
    work.mkdir()
    for name in ("bench", "omni"):
        (work / name).symlink_to(root / name)
    kit = work / ".sglkit"
    (kit / "b" / "sglang").mkdir(parents=True)
    (kit / "b" / "sglang" / "__init__.py").write_text(STAND_IN_SGLANG)
    (kit / "shim").mkdir()
    (kit / "install.sh").write_text(FAKE_INSTALL)
    site = tmp_path / "site"
    site.mkdir()
    if part_a:
        (site / ".sglkit-part-a").touch()  # the first call installed part a
    env = {**os.environ, "SCALED": "1", "PARTS": "sglang", "SGLKIT_TARGET": str(site), "R": str(tmp_path / "r"),
           "OUT": str(tmp_path / "out"), "EQUAL_ARGS": "--layers 2 --requests 4 --max-tokens 5 --prompt-len 8",
           "PYTHONPATH": str(root)}
    proc = subprocess.run(["bash", str(root / "bench/h200/issue12.sh")], cwd=work, env=env, capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rep = json.loads((tmp_path / "r" / "equal_work" / "equal_work.json").read_text())
    phases = [(p["name"], p["status"]) for p in rep["phases"]]
    out = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert out == ["equal_work.md", "issue12.log", "issue12.tgz"]
    assert (tmp_path / "r" / "sglkit.ok").exists() == part_a
    if part_a:
        assert phases == [("checkpoint", "ok"), ("omni", "ok"), ("sglang", "ok"), ("experts", "ok")], phases
        assert {r["engine"] for r in rep["rows"]} == {"omni", "sglang"}
    else:
        assert phases[:2] == [("checkpoint", "ok"), ("omni", "ok")] and phases[-1] == ("experts", "ok")
        assert phases[2][0] == "sglang" and phases[2][1].startswith("skipped: SGLang's install failed")
        assert {r["engine"] for r in rep["rows"]} == {"omni"}
