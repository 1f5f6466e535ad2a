"""Equal work against SGLang: omni's built-in engine and SGLang on the same weights, the same
distinct prompts and the same output lengths, with the experts each workload hit.

Why: the earlier peer table ran SGLang on `load_format="dummy"` weights with a few repeated
prompts; at batch 16 its step time (4.5 ms) was below the time it takes to read the experts that
16 distinct tokens hit through omni's weights (~84 of 128 a layer), so the two runs did not do the
same work. Here:

1. `checkpoint`: a reduced-depth, full-width Qwen3-Omni thinker text model (hidden 2048, 128 experts
   top-8, moe_intermediate 768, 32/4 heads, vocabulary 152,064; `--layers` deep, default 8) is
   written once as a Qwen3-MoE checkpoint with seeded random bf16 weights
   (omni/models/qwen3_omni/checkpoint/text_checkpoint.py);
2. `omni`: omni's built-in AR engine loads it (`load_text_thinker`) and runs the load in-process
   (bench/omni_engine_load.py: CUDA graphs, Triton attention and MoE);
3. `sglang`: SGLang's offline Engine loads the same directory (`load_format="auto"`) and runs the
   same load (bench/sglang_engine_load.py --prompt-len);
4. `experts`: both engines' token streams are replayed through the checkpoint's routers
   (bench/expert_hits.py) for the experts hit per layer per decode step.
Load: distinct random prompts (request i: its own `--prompt-len` token ids, the same for both
engines), greedy, `--max-tokens` with ignore_eos, closed loop of c clients, levels 1,16,64 with
max(2c, 8) requests, every level warmed once first. Both engines in-process, no HTTP.

Each phase has a time limit inside `--budget-s`; whatever happens, `equal_work.json` and
`equal_work.md` are written from what exists (a phase that failed leaves its rows out).

Run:  python bench/equal_work.py --out-dir OUT [--layers 8] [--engines omni,sglang] [--budget-s 225]
      python bench/equal_work.py --out-dir OUT --scaled --engines omni      (CPU, test sizes)
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from equal_work_support import agreement  # noqa: E402
from report import machine, md_table, now_iso, say, write  # noqa: E402
from suite_support import gpu_name, read_json, run_phase  # noqa: E402

PY = sys.executable
ENGINES = ("omni", "sglang")


def step_bytes(cfg: dict, hits_by_layer: list[float]) -> float:
    """Weight bytes one decode step reads (bf16) when layer l's tokens hit hits_by_layer[l] experts:
    attention, norms and router of every layer, the hit experts, the lm_head (KV reads not counted)."""
    h, hd, e = cfg["hidden_size"], cfg["head_dim"], cfg["num_experts"]
    attn = h * hd * (2 * cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) + 2 * hd
    per_layer = attn + 2 * h + e * h
    expert = 3 * h * cfg["moe_intermediate_size"]
    return 2.0 * (sum(per_layer + hit * expert for hit in hits_by_layer) + cfg["vocab_size"] * h + h)


class EqualWork:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.out = args, Path(args.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.phases: list[dict] = []
        self.engines = [e for e in args.engines.split(",") if e]
        unknown = set(self.engines) - set(ENGINES)
        if unknown:
            raise SystemExit(f"unknown engines {sorted(unknown)}; known: {ENGINES}")
        self.model_dir: Path | None = None
        self.cfg: dict | None = None
        self.marker: dict | None = None

    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t0)

    def limit(self, want: float, reserve: float) -> float:
        return max(0.0, min(want, self.left() - reserve))

    def reserve_after(self, phase: str) -> float:
        a = self.args
        order = ["checkpoint", *self.engines, "experts"]
        mins = {"checkpoint": 0.0, "omni": a.omni_min_s, "sglang": a.sglang_min_s, "experts": a.experts_min_s}
        return sum(mins[p] for p in order[order.index(phase) + 1:])

    def load_args(self) -> list[str]:
        a = self.args
        out = ["--concurrency", a.concurrency, "--max-tokens", str(a.max_tokens), "--prompt-len", str(a.prompt_len),
               "--seed", str(a.seed)]
        return out + (["--requests", str(a.requests)] if a.requests else [])

    def run(self, name: str, cmd: list[str], want: float, env: dict | None = None) -> dict:
        return run_phase(self.phases, self.out, name, cmd, self.limit(want, self.reserve_after(name)), self.t0, env)

    def sglang_ready(self) -> bool:
        """With --sglang-wait FILE (SGLang's packages still installing in the background): wait for it,
        then for --sglang-ok FILE (the install succeeded); a phase record says why SGLang did not run."""
        a = self.args
        if not a.sglang_wait:
            return True
        t = time.monotonic()
        deadline = max(0.0, self.left() - self.reserve_after("sglang") - a.sglang_min_s)
        while not Path(a.sglang_wait).exists() and time.monotonic() - t < deadline:
            time.sleep(1.0)
        waited = round(time.monotonic() - t, 1)
        if not Path(a.sglang_wait).exists():
            self.phases.append({"name": "sglang", "seconds": waited,
                                "status": f"skipped: SGLang's install had not finished after {waited}s"})
            return False
        if a.sglang_ok and not Path(a.sglang_ok).exists():
            self.phases.append({"name": "sglang", "seconds": waited,
                                "status": "skipped: SGLang's install failed or is incomplete (see the kit logs)"})
            return False
        if waited > 1:
            say(f"waited {waited}s for SGLang's install")
        return True

    def sglang_env(self) -> dict | None:
        """SGLang's packages (the GPU kit's /tmp/site and shim) for its phase alone: omni's phases run
        without them."""
        import os

        if not self.args.sglang_path:
            return None
        rest = [str(ROOT), os.environ.get("PYTHONPATH", "")]
        return {"PYTHONPATH": os.pathsep.join(p for p in [self.args.sglang_path, *rest] if p)}

    def main(self) -> dict:
        a = self.args
        work = None
        try:
            if a.model_dir and (Path(a.model_dir) / "config.json").exists():
                self.model_dir = Path(a.model_dir)
                self.phases.append({"name": "checkpoint", "status": f"reused {a.model_dir}"})
            else:
                work = Path(a.model_dir) if a.model_dir else Path(tempfile.mkdtemp(prefix="omni-equal-work-"))
                self.model_dir = work / "model" if not a.model_dir else work
                cmd = [PY, "-m", "omni.models.qwen3_omni.checkpoint.text_checkpoint", str(self.model_dir), "--layers",
                       str(a.layers), "--seed", str(a.weight_seed), "--device", a.device] + (["--scaled"] if a.scaled else [])
                if self.run("checkpoint", cmd, a.checkpoint_limit_s)["status"] != "ok":
                    return self.report()
            self.cfg = read_json(self.model_dir / "config.json")
            self.marker = read_json(self.model_dir / "omni_text_checkpoint.json")
            for engine in self.engines:
                if engine == "omni":
                    cmd = [PY, "bench/omni_engine_load.py", "--model-path", str(self.model_dir), "--device", a.device,
                           *self.load_args(), "--out", str(self.out / "omni.json"),
                           "--tokens-out", str(self.out / "omni_tokens.json")]
                    self.run("omni", cmd, a.omni_limit_s)
                else:
                    if not self.sglang_ready():
                        continue
                    cmd = [PY, "bench/sglang_engine_load.py", "--model-path", str(self.model_dir), *self.load_args(),
                           "--load-format", "auto", "--out", str(self.out / "sglang.json"),
                           "--tokens-out", str(self.out / "sglang_tokens.json")]
                    if a.sglang_engine_args:
                        cmd += ["--engine-args", a.sglang_engine_args]
                    self.run("sglang", cmd, a.sglang_limit_s, self.sglang_env())
            tokens = [str(self.out / f"{e}_tokens.json") for e in self.engines if (self.out / f"{e}_tokens.json").exists()]
            if tokens:
                cmd = [PY, "bench/expert_hits.py", "--model-path", str(self.model_dir), "--tokens", *tokens,
                       "--device", a.device, "--out", str(self.out / "experts.json")]
                self.run("experts", cmd, a.experts_limit_s)
            return self.report()
        finally:
            if work is not None and not a.keep_model:
                shutil.rmtree(work, ignore_errors=True)

    def report(self) -> dict:
        a = self.args
        cfg, marker = self.cfg, self.marker
        results = {e: read_json(self.out / f"{e}.json") for e in ENGINES}
        experts = {(r["engine"], r["concurrency"]): r for r in (read_json(self.out / "experts.json") or {}).get("rows", [])}
        tok = {e: read_json(self.out / f"{e}_tokens.json") for e in ENGINES}
        agree = agreement(tok["omni"], tok["sglang"]) if tok["omni"] and tok["sglang"] else None
        rows = []
        for c in [int(x) for x in a.concurrency.split(",")]:
            for engine in ENGINES:
                lv = next((l for l in (results[engine] or {}).get("levels", []) if l["concurrency"] == c
                           and l.get("phase", "warm") == "warm"), None)
                if lv is None:
                    continue
                ex = experts.get((engine, c)) or {}
                row = {"engine": engine, "concurrency": c, "ok": f"{lv['ok']}/{lv['requests']}",
                       "ttft_p50_ms": (lv.get("ttft_ms") or {}).get("p50"),
                       "tpot_p50_ms": (lv.get("tpot_ms") or {}).get("p50"),
                       "tpot_p90_ms": (lv.get("tpot_ms") or {}).get("p90"),
                       "e2e_p50_ms": (lv.get("e2e_ms") or {}).get("p50"),
                       "e2e_p90_ms": (lv.get("e2e_ms") or {}).get("p90"),
                       "output_tok_s": (lv.get("throughput") or {}).get("output_tokens_per_s"),
                       "experts_hit_per_layer": ex.get("hits_per_layer_mean"),
                       "uniform_expectation": ex.get("uniform_expectation"),
                       "batch_at_samples": ex.get("batch_mean"),
                       "distinct_streams": (ex.get("streams") or {}).get("distinct_streams")}
                if cfg and ex.get("hits_by_layer"):
                    floor = step_bytes(cfg, ex["hits_by_layer"]) / (a.hbm_tbps * 1e12) * 1e3
                    row["weight_read_floor_ms"] = round(floor, 3)
                    row["tpot_over_floor"] = round(row["tpot_p50_ms"] / floor, 2) if row["tpot_p50_ms"] else None
                rows.append(row)
        for c in {r["concurrency"] for r in rows}:
            pair = {r["engine"]: r for r in rows if r["concurrency"] == c}
            if "omni" in pair and "sglang" in pair and pair["sglang"]["tpot_p50_ms"]:
                pair["omni"]["tpot_vs_sglang"] = round(pair["omni"]["tpot_p50_ms"] / pair["sglang"]["tpot_p50_ms"], 3)
        rep = {"date": now_iso(), "command": " ".join([PY, "bench/equal_work.py", *sys.argv[1:]]), "machine": machine(),
               "gpu": gpu_name(), "seconds": round(time.monotonic() - self.t0, 1), "model": cfg, "checkpoint": marker,
               "workload": {"prompts": "distinct random token ids per request", "prompt_len": a.prompt_len,
                            "seed": a.seed, "max_tokens": a.max_tokens, "ignore_eos": True, "sampling": "greedy",
                            "levels": a.concurrency, "requests": a.requests or "max(2c, 8)"},
               "experts_method": (read_json(self.out / "experts.json") or {}).get("method"),
               "engine_start": {"omni_load_s": (results["omni"] or {}).get("load_s"),
                                "omni_capture_s": (results["omni"] or {}).get("capture_s"),
                                "omni_warmup_s": (results["omni"] or {}).get("warmup_s"),
                                "sglang_start_s": (results["sglang"] or {}).get("engine_start_s")},
               "token_agreement": agree, "phases": self.phases, "rows": rows}
        return write(rep, self.out / "equal_work.json", self.out / "equal_work.md", markdown)


COLUMNS = ["engine", "concurrency", "ok", "ttft_p50_ms", "tpot_p50_ms", "tpot_p90_ms", "e2e_p50_ms", "e2e_p90_ms",
           "output_tok_s", "tpot_vs_sglang", "experts_hit_per_layer", "uniform_expectation", "batch_at_samples",
           "weight_read_floor_ms", "tpot_over_floor", "distinct_streams"]


def markdown(rep: dict) -> str:
    m = rep.get("model") or {}
    ck = rep.get("checkpoint") or {}
    out = [f"## Equal work: omni's built-in engine vs SGLang, {rep['date']}", "",
           f"Machine: {rep.get('gpu') or rep['machine'].get('cpu_model', '?')}; {rep['seconds']} s. Model: the Qwen3-Omni "
           f"thinker's text model at {m.get('num_hidden_layers', '?')} layers, full width (hidden {m.get('hidden_size')}, "
           f"{m.get('num_experts')} experts top-{m.get('num_experts_per_tok')}, moe_intermediate "
           f"{m.get('moe_intermediate_size')}, vocab {m.get('vocab_size')}), {ck.get('params', 0) / 1e9:.2f}B parameters, "
           f"seeded random bf16 (seed {ck.get('seed')}, std {ck.get('std')}) written once as a Qwen3-MoE checkpoint and "
           "loaded by both engines.", "",
           f"Load: {rep['workload']['prompts']} ({rep['workload']['prompt_len']} ids), {rep['workload']['max_tokens']} output "
           f"tokens with ignore_eos, greedy, closed loop, {rep['workload']['requests']} requests a level, each level warmed "
           "once; both engines in-process (no HTTP).", "",
           "| phase | seconds | result |", "|---|---|---|"]
    out += [f"| {p['name']} | {p.get('seconds', '–')} | {p.get('status', '?')} |" for p in rep["phases"]]
    out += ["", *md_table(COLUMNS, rep["rows"])]
    agree = rep.get("token_agreement")
    out += ["", f"Engine start: {rep['engine_start']}.",
            f"Token agreement omni vs SGLang (same weights, same prompts, greedy): {agree}." if agree else "",
            "", "Both engines run in-process: omni's engine stepped in the driver's thread (no IPC), SGLang's offline "
            "Engine with its scheduler and detokenizer in their own processes, outputs streamed back over ZeroMQ "
            "(its HTTP server does not import on the GPU image).",
            "", f"Experts hit: {rep.get('experts_method') or 'not measured'}. `uniform_expectation`: what the same batch "
            "sizes would hit with uniformly random routing; `weight_read_floor_ms`: the bf16 weight bytes a step reads at "
            "those hits (attention, routers, hit experts, lm_head) over 4.8 TB/s."]
    return "\n".join(out) + "\n"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--engines", default="omni,sglang")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--weight-seed", type=int, default=0)
    ap.add_argument("--model-dir", default=None, help="reuse (or write and keep) the checkpoint here")
    ap.add_argument("--keep-model", action="store_true")
    ap.add_argument("--scaled", action="store_true", help="test widths (CPU dry run)")
    ap.add_argument("--device", default=None, help="default cuda (cpu with --scaled)")
    ap.add_argument("--concurrency", default=None, help="default 1,16,64 (1,4 with --scaled)")
    ap.add_argument("--requests", type=int, default=None, help="per level (default max(2c, 8))")
    ap.add_argument("--max-tokens", type=int, default=None, help="default 128 (8 with --scaled)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0, help="of the prompts")
    ap.add_argument("--sglang-engine-args", default=None, help="JSON of extra sglang.Engine arguments")
    ap.add_argument("--sglang-path", default=None,
                    help="PYTHONPATH entries put first for the SGLang phase only (e.g. /tmp/site:.sglkit/shim)")
    ap.add_argument("--sglang-wait", default=None, help="a file whose existence says SGLang's install ended")
    ap.add_argument("--sglang-ok", default=None, help="a file whose existence says SGLang's install succeeded")
    ap.add_argument("--hbm-tbps", type=float, default=4.8)
    ap.add_argument("--budget-s", type=float, default=225.0)
    ap.add_argument("--checkpoint-limit-s", type=float, default=90.0)
    ap.add_argument("--omni-limit-s", type=float, default=90.0)
    ap.add_argument("--sglang-limit-s", type=float, default=170.0)
    ap.add_argument("--experts-limit-s", type=float, default=60.0)
    ap.add_argument("--omni-min-s", type=float, default=30.0, help="kept for omni by the phases before it")
    ap.add_argument("--sglang-min-s", type=float, default=90.0, help="kept for SGLang by the phases before it")
    ap.add_argument("--experts-min-s", type=float, default=35.0, help="kept for the replay by the phases before it")
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    args.device = args.device or ("cpu" if args.scaled else "cuda")
    args.concurrency = args.concurrency or ("1,4" if args.scaled else "1,16,64")
    args.max_tokens = args.max_tokens or (8 if args.scaled else 128)
    run = EqualWork(args)

    def on_term(signum, frame):  # `timeout` sends SIGTERM: write what exists
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    try:
        return run.main()
    except BaseException as exc:
        run.phases.append({"name": "equal_work", "status": f"aborted: {type(exc).__name__}: {exc}"})
        run.report()
        raise


if __name__ == "__main__":
    rep = main()
    print(markdown(rep))
