"""One command for issue 7's serving numbers: omnid serving the full-size Qwen3-Omni-30B-A3B
(random bf16 weights, every model stage on the GPU, CUDA graphs in thinker and talker, cuda_ipc
between GPU stages: the kernel's "auto" channel) under bench/serve.py, then transformers
(bench/hf_baseline.py) on the same GPU and workload, and one combined report.

What users get: every request at the server's own sampling (bench/serve.py sends no
temperature: the talker samples at its defaults), fixed output lengths (ignore_eos + max_tokens for
text and talker frames). A fresh server and a warmed one are reported apart, and greedy is an
extra line.

Phases, each with a time limit inside a total budget (transformers keeps a reserve):
write the random model dir -> start omnid and wait for /health -> the **cold** levels
(`--cold`, default 1,16: the first requests after start, no warm-up) -> warm-up pass through
every level (CUDA graph buckets) -> the **warm** sweep, bench/serve.py per level (default
1,4,16,32,64) -> the **greedy** extra line (`--greedy-levels`, default 1,16, after its own short
warm-up) -> stop omnid -> hf_baseline (unless --no-hf). Every level row carries its phase
(cold / warm / greedy) in suite.json and suite.md. Whatever happens (a phase fails or times
out, SIGTERM), omnid's process group is killed and `suite.json` / `suite.md` / `omni_vs_hf.png`
are written from what exists.

`--omnid-arg ARG` (repeatable) passes extra flags to `omnid serve` (e.g. an MPS switch),
`--set STAGE.FIELD=VALUE` extra stage overrides, `--label` names the run in the report.

Run:  python bench/gpu_suite.py --out-dir OUT [--concurrency 1,4,16,32,64] [--cold 1,16] [--budget-s 390]
      python bench/gpu_suite.py --out-dir OUT --scaled [--omnid-mode inline]   (CPU, test sizes)
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from serve_report import machine, now_iso, plot, say  # noqa: E402
from suite_report import cold_vs_warm, comparison, markdown, merge_levels  # noqa: E402
from suite_support import (child_env, free_port, gpu_name, health_ok, kill_group, last_line, read_json,  # noqa: E402
                           run_phase, write_scaled_hf_checkpoint)

GPU_STAGES = ("audio_encoder", "vision_encoder", "thinker", "talker", "code2wav")
PY = sys.executable


def apply_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """The defaults that depend on --scaled (full size: levels 1,4,16,32,64, cold 1,16, greedy 1,16)."""
    scaled = args.scaled
    args.device = args.device or ("cpu" if scaled else "cuda")
    args.concurrency = args.concurrency or ("1,2" if scaled else "1,4,16,32,64")
    args.cold = ("1" if scaled else "1,16") if args.cold is None else args.cold
    args.greedy_levels = ("1" if scaled else "1,16") if args.greedy_levels is None else args.greedy_levels
    args.max_tokens = args.max_tokens or (4 if scaled else 32)
    args.audio_tokens = args.audio_tokens or (6 if scaled else 64)
    return args


class Suite:
    def __init__(self, args: argparse.Namespace) -> None:
        args = apply_defaults(args)
        self.args, self.out = args, Path(args.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.phases: list[dict] = []
        self.commands: list[str] = []
        self.omnid: subprocess.Popen | None = None
        self.gpu: str | None = None
        self.url = ""
        self.levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
        self.probes: list[dict] = []
        self.cold = [int(c) for c in args.cold.split(",") if c.strip()]
        self.greedy = [int(c) for c in args.greedy_levels.split(",") if c.strip()]

    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t0)

    def limit(self, want: float, reserve: float = 0.0) -> float:
        return max(0.0, min(want, self.left() - reserve))

    def run(self, name: str, cmd: list[str], limit: float, env: dict | None = None) -> dict:
        """A child in its own process group, killed with it past `limit`; output to OUT/<name>.log."""
        phase = run_phase(self.phases, self.out, name, cmd, limit, self.t0, env)
        self.commands.append(phase["command"])
        return phase

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.t0:6.1f}s"

    # ---- omnid -------------------------------------------------------------------------
    def omnid_sets(self) -> list[str]:
        a = self.args
        if a.scaled:
            return []
        seqs = max(32, *self.levels, *self.cold, *self.greedy)
        sets = [f"{s}.device={a.device}" for s in GPU_STAGES] + [f"{s}.args.dtype=bfloat16" for s in GPU_STAGES]
        for ar in ("thinker", "talker"):  # KV for `seqs` sequences of up to max_model_len 4096, graphs up to `seqs`
            sets += [f"{ar}.args.cuda_graphs=true", f"{ar}.args.max_num_seqs={seqs}",
                     f"{ar}.args.cuda_graph_max_batch={seqs}", f"{ar}.args.num_blocks={a.kv_blocks}"]
        return sets + [f"thinker.args.attention_backend={a.thinker_attention}"] + list(a.extra_set)

    def start_omnid(self, model_dir: Path) -> bool:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = [PY, "-m", "omni.api.cli", "serve", "--model", str(model_dir), "--port", str(port),
               "--mode", self.args.omnid_mode] + [x for s in self.omnid_sets() for x in ("--set", s)]
        cmd += list(self.args.omnid_arg)
        phase = {"name": "omnid_start", "command": shlex.join(cmd)}
        self.phases.append(phase)
        self.commands.append(phase["command"])
        limit = self.limit(self.args.start_limit_s, 0.0 if self.args.no_hf else self.args.hf_reserve_s)
        say(f"[{self.elapsed()}] omnid_start: {phase['command']} (limit {limit:.0f}s)")
        self.omnid_log = open(self.out / "omnid.log", "w")
        self.omnid = subprocess.Popen(cmd, stdout=self.omnid_log, stderr=subprocess.STDOUT, start_new_session=True,
                                      cwd=ROOT, env=child_env())
        t, last = time.monotonic(), ""
        while time.monotonic() - t < limit:
            if self.omnid.poll() is not None:
                phase.update(status=f"omnid exited (rc {self.omnid.returncode}, see omnid.log)")
                break
            if health_ok(self.url):
                phase.update(status="ok")
                break
            line = last_line(self.out / "omnid.log")
            if line != last:
                say(f"[{self.elapsed()}]   omnid: {line[:200]}")
                last = line
            time.sleep(1.0)
        else:
            phase.update(status=f"not healthy after {limit:.0f}s")
        phase["seconds"] = round(time.monotonic() - t, 1)
        say(f"[{self.elapsed()}] omnid_start: {phase['status']} in {phase['seconds']}s")
        return phase["status"] == "ok"

    def stop_omnid(self) -> None:
        if self.omnid is None:
            return
        t = time.monotonic()
        try:
            with urllib.request.urlopen(self.url + "/metrics", timeout=5) as resp:
                (self.out / "omnid_metrics.txt").write_bytes(resp.read())
        except Exception:  # metrics are a nice-to-have
            pass
        status = kill_group(self.omnid, grace=self.args.stop_limit_s, first=signal.SIGINT)
        self.phases.append({"name": "omnid_stop", "seconds": round(time.monotonic() - t, 1), "status": status})
        self.omnid = None

    # ---- phases ------------------------------------------------------------------------
    def serve_cmd(self, name: str, levels: str, requests: int | None, warmup: int, max_tokens: int,
                  audio_tokens: int, phase: str, greedy: bool = False) -> list[str]:
        a = self.args
        note = f"omnid on {self.gpu or 'cpu'}, random full-size weights" if not a.scaled else "omnid, scaled"
        cmd = [PY, "bench/serve.py", "--url", self.url, "--concurrency", levels, "--cold", "", "--phase", phase,
               "--warmup", str(warmup), "--prompt-set", a.prompt_set, "--max-tokens", str(max_tokens),
               "--audio-tokens", str(audio_tokens), "--label", a.label, "--timeout", "300",
               "--out", str(self.out / f"{name}.json"), "--server-note", note]
        cmd += ["--greedy"] if greedy else []
        return cmd + (["--requests", str(requests)] if requests else [])

    def plan(self) -> list[tuple[str, list[str], float]]:
        """Every serve phase in order: (name, bench/serve.py command, wanted seconds). The cold levels
        come first on the fresh server; a level's measured JSON is `<name>.json`."""
        a = self.args
        n = lambda c: a.requests or (4 if c == 1 else 2 * c)  # noqa: E731
        level_s = lambda c: a.level_limit_s + 2 * c  # noqa: E731
        out = [(f"serve_cold_c{c}", self.serve_cmd(f"serve_cold_c{c}", str(c), n(c), 0, a.max_tokens, a.audio_tokens,
                                                   "cold"), level_s(c)) for c in self.cold]
        if a.prewarm:
            out.append(("serve_prewarm", self.serve_cmd("serve_prewarm", a.concurrency, None, 0, 4, 4, "prewarm"),
                        a.prewarm_limit_s))
        out += [(f"serve_c{c}", self.serve_cmd(f"serve_c{c}", str(c), n(c), 2 if i == 0 and not a.prewarm else 0,
                                               a.max_tokens, a.audio_tokens, "warm"), level_s(c))
                for i, c in enumerate(self.levels)]
        if self.greedy:
            if a.prewarm:
                levels = ",".join(map(str, self.greedy))
                out.append(("serve_prewarm_greedy", self.serve_cmd("serve_prewarm_greedy", levels, None, 0, 4, 4,
                                                                   "prewarm", greedy=True), a.prewarm_limit_s / 2))
            out += [(f"serve_greedy_c{c}", self.serve_cmd(f"serve_greedy_c{c}", str(c), n(c), 0, a.max_tokens,
                                                          a.audio_tokens, "greedy", greedy=True), level_s(c))
                    for c in self.greedy]
        return out

    def measured(self) -> list[str]:
        """Names of the phases whose JSON holds measured levels (cold, warm, greedy; not the warm-ups)."""
        return [name for name, _, _ in self.plan() if "prewarm" not in name]

    def stage_clocks(self) -> dict[str, list[float]]:
        """{stage: [steps, step seconds]} from omnid's /metrics (the stage drivers' clocks)."""
        clocks: dict[str, list[float]] = {}
        try:
            with urllib.request.urlopen(self.url + "/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except Exception:  # metrics are a nice-to-have
            return clocks
        for line in text.splitlines():
            for i, metric in enumerate(("omni_stage_steps{", "omni_stage_step_seconds{")):
                if line.startswith(metric) and 'stage="' in line:
                    stage = line.split('stage="', 1)[1].split('"', 1)[0]
                    clocks.setdefault(stage, [0.0, 0.0])[i] = float(line.rsplit(" ", 1)[1])
        return clocks

    def probe_first(self) -> None:
        """The fresh server's first requests one at a time, with each stage's step seconds per
        request (where a cold request's time goes); before every other phase."""
        for i in range(self.args.probe_first):
            before = self.stage_clocks()
            name = f"serve_probe_{i}"
            self.run(name, self.serve_cmd(name, "1", 1, 0, self.args.max_tokens, self.args.audio_tokens, "probe"),
                     self.limit(60.0))
            after = self.stage_clocks()
            row = read_json(self.out / f"{name}.json") or {}
            level = (row.get("levels") or [{}])[0]
            self.probes.append({"request": i, "ttfa_ms": level.get("ttfa_ms", {}).get("p50"),
                                "e2e_ms": level.get("e2e_ms", {}).get("p50"),
                                "stage_seconds": {k: round(v[1] - before.get(k, [0, 0])[1], 4) for k, v in after.items()},
                                "stage_steps": {k: int(v[0] - before.get(k, [0, 0])[0]) for k, v in after.items()}})
            say(f"[{self.elapsed()}] probe {i}: {json.dumps(self.probes[-1])}")

    def serve_all(self) -> None:
        reserve = (0.0 if self.args.no_hf else self.args.hf_reserve_s) + self.args.stop_limit_s
        self.probe_first()
        for name, cmd, want in self.plan():
            limit = self.limit(want, reserve)  # no new request past 60 % of it: the level's rows survive
            self.run(name, cmd + ["--level-deadline-s", f"{0.6 * limit:.1f}"], limit)

    def hf(self, hf_dir: Path | None) -> None:
        a = self.args
        src = ["--model", str(hf_dir)] if hf_dir else ["--random-full"]
        cmd = [PY, "bench/hf_baseline.py", *src, "--device", a.device, "--concurrency", a.concurrency,
               "--service-requests", str(a.hf_requests), "--warmup", "0", "--prompt-set", a.prompt_set,
               "--max-tokens", str(a.max_tokens), "--audio-tokens", str(a.audio_tokens), "--out", str(self.out / "hf.json")]
        self.run("hf_baseline", cmd, self.limit(a.hf_limit_s))

    def report(self) -> dict:
        omni = merge_levels([read_json(self.out / f"{name}.json") for name in self.measured()])
        hf = read_json(self.out / "hf.json")
        rep = {"date": now_iso(), "model": "qwen3-omni scaled (CPU)" if self.args.scaled else "Qwen3-Omni-30B-A3B, random bf16",
               "machine": machine(), "gpu": self.gpu, "seconds": round(time.monotonic() - self.t0, 1),
               "label": self.args.label,
               "workload": {"prompt_set": self.args.prompt_set, "max_tokens": self.args.max_tokens,
                            "audio_tokens": self.args.audio_tokens, "concurrency": self.levels, "cold": self.cold,
                            "greedy": self.greedy, "sampling": "server default (no temperature sent); "
                            "greedy rows: temperature 0 for text and talker"},
               "omnid_sets": self.omnid_sets(), "omnid_args": list(self.args.omnid_arg), "phases": self.phases,
               "commands": self.commands, "comparison": comparison(omni, hf), "cold_vs_warm": cold_vs_warm(omni),
               "cold_probe": self.probes,
               "omni": omni, "hf": hf}
        if omni or hf:
            try:
                plot([r for r in (omni, hf) if r], str(self.out / "omni_vs_hf.png"))
            except Exception as exc:  # no matplotlib: the tables still stand
                rep["plot_error"] = f"{type(exc).__name__}: {exc}"
        (self.out / "suite.json").write_text(json.dumps(rep, indent=2) + "\n")
        (self.out / "suite.md").write_text(markdown(rep))
        return rep

    def main(self) -> dict:
        from omni.models.qwen3_omni.checkpoint.presets_full import scaled_config, write_random_model_dir

        self.gpu = gpu_name()
        work = Path(tempfile.mkdtemp(prefix="omni-suite-"))  # model dirs: not worth copying back with OUT
        try:
            model_dir = write_random_model_dir(work / "model", scaled_config() if self.args.scaled else None)
            hf_dir = write_scaled_hf_checkpoint(work / "hf_model") if self.args.scaled else None
            try:
                if self.start_omnid(model_dir):
                    self.serve_all()
            finally:
                self.stop_omnid()
            if not self.args.no_hf:
                self.hf(hf_dir)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return self.report()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--scaled", action="store_true", help="CPU, the scaled config (a dry run of the orchestration)")
    ap.add_argument("--device", default=None, help="default cuda (cpu with --scaled)")
    ap.add_argument("--concurrency", default=None, help="warm levels, default 1,4,16,32,64 (1,2 with --scaled)")
    ap.add_argument("--cold", default=None, help="levels run first on the fresh server, no warm-up (default 1,16; "
                                                "1 with --scaled; '' for none)")
    ap.add_argument("--greedy-levels", default=None, help="the greedy extra line after the warm sweep (default 1,16; "
                                                         "1 with --scaled; '' for none)")
    ap.add_argument("--label", default="omni", help="this run's name in the report (e.g. omni-mps)")
    ap.add_argument("--omnid-arg", action="append", default=[], metavar="ARG",
                    help="an extra `omnid serve` argument (repeat; use --omnid-arg=--flag for dashes)")
    ap.add_argument("--requests", type=int, default=None, help="per level (default 4 at c=1, else 2c)")
    ap.add_argument("--prompt-set", default="short")
    ap.add_argument("--max-tokens", type=int, default=None, help="thinker tokens (default 32; 4 with --scaled)")
    ap.add_argument("--audio-tokens", type=int, default=None, help="talker frames (default 64; 6 with --scaled)")
    ap.add_argument("--omnid-mode", choices=("process", "inline"), default="process")
    ap.add_argument("--kv-blocks", type=int, default=1024, help="KV blocks of thinker and talker (16 tokens each)")
    ap.add_argument("--thinker-attention", default="triton", choices=("torch", "triton"))
    ap.add_argument("--no-prewarm", dest="prewarm", action="store_false")
    ap.add_argument("--probe-first", type=int, default=0, metavar="N",
                    help="first N requests one at a time with per-stage step seconds (before the cold levels)")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--set", dest="extra_set", action="append", default=[], metavar="STAGE.FIELD=VALUE",
                    help="more omnid overrides, e.g. thinker.args.backend=sglang")
    ap.add_argument("--hf-requests", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=390.0)
    ap.add_argument("--start-limit-s", type=float, default=180.0)
    ap.add_argument("--prewarm-limit-s", type=float, default=45.0)
    ap.add_argument("--level-limit-s", type=float, default=45.0, help="per level, plus 2 s per client")
    ap.add_argument("--stop-limit-s", type=float, default=30.0)
    ap.add_argument("--hf-limit-s", type=float, default=110.0)
    ap.add_argument("--hf-reserve-s", type=float, default=100.0, help="kept for hf_baseline by earlier phases")
    return ap


def main(argv: list[str] | None = None) -> dict:
    suite = Suite(build_parser().parse_args(argv))

    def on_term(signum, frame):  # `timeout` sends SIGTERM: stop omnid, write what exists
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    try:
        return suite.main()
    except BaseException as exc:
        suite.phases.append({"name": "suite", "status": f"aborted: {type(exc).__name__}: {exc}"})
        suite.stop_omnid()
        suite.report()
        raise


if __name__ == "__main__":
    report = main()
    print(markdown(report))
