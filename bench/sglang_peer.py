"""SGLang as the peer: the Qwen3-Omni-30B-A3B thinker's text model (random bf16 weights) served by
(1) SGLang alone (its offline `Engine`, `load_format="dummy"`, driven in-process by
bench/sglang_engine_load.py: the GPU image cannot import SGLang's HTTP server, and leaving HTTP out
favours SGLang slightly), (2) omnid's `text` variant on the
built-in engine, (3) omnid's `text` variant with the thinker on the SGLang backend — same GPU, same
prompts, same run, one system at a time: bench/serve.py (streamed chat completions, fixed output
length with `ignore_eos`, text only) at each concurrency level. Reports TTFT, TPOT, throughput per
system and level, and each omni system's ratios to SGLang alone.

Equal work: the same prompts through each server's chat template (the same offline tokenizer), the
same output length, prefix caching off everywhere (SGLang's radix cache, the built-in engine's), CUDA
graphs on everywhere, Triton attention everywhere (the GPU kit's SGLang has no FA3).

Run:  python bench/sglang_peer.py --out-dir OUT [--systems sglang,omni-builtin,omni-sglang]
          [--concurrency 1,16,64] [--max-tokens 128] [--budget-s 540]
Progress goes to stderr; OUT gets <system>.json / .log, peer.json and peer.md.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from report import machine, md_table, now_iso, say, write  # noqa: E402
from suite_support import child_env, free_port, gpu_name, health_ok, kill_group, last_line, read_json  # noqa: E402

PY = sys.executable
SYSTEMS = ("sglang", "omni-builtin", "omni-sglang")


def server_command(system: str, model_dir: Path, text_dir: Path, port: int, max_seqs: int) -> list[str]:
    """omnid's command for an omni system (SGLang alone runs in-process: `run_sglang_alone`)."""
    sets = [f"{s}.{field}" for s in ("thinker", "audio_encoder", "vision_encoder")
            for field in ("device=cuda", "args.dtype=bfloat16")]
    sets += [f"thinker.args.max_num_seqs={max_seqs}", "thinker.args.max_model_len=4096", "thinker.start_timeout_s=480"]
    if system == "omni-builtin":
        sets += ["thinker.args.cuda_graphs=true", f"thinker.args.cuda_graph_max_batch={max_seqs}",
                 "thinker.args.enable_prefix_caching=false",
                 "thinker.args.attention_backend=triton", f"thinker.args.num_blocks={max_seqs * 256 // 16 + 64}"]
    else:
        sets += ["thinker.args.backend=sglang", f"thinker.args.sglang_export_dir={text_dir.parent / 'export'}",
                 'thinker.args.sglang_args={"attention_backend": "triton", "disable_radix_cache": true, '
                 '"log_level": "warning"}']
    return [PY, "-m", "omni.api.cli", "serve", "--model", str(model_dir), "--variant", "text", "--port", str(port),
            "--max-concurrent", str(max(64, max_seqs))] + [x for s in sets for x in ("--set", s)]


class Peer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.out = args, Path(args.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.phases: list[dict] = []
        self.levels = [int(c) for c in args.concurrency.split(",")]

    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t0)

    def log(self, text: str) -> None:
        say(f"[{time.monotonic() - self.t0:6.1f}s] {text}")

    def model_dirs(self) -> tuple[Path, Path]:
        from omni.models.qwen3_omni.checkpoint.export_text import export_thinker_text
        from omni.models.qwen3_omni.checkpoint.presets_full import write_random_model_dir

        model_dir = write_random_model_dir(self.out / "model")
        return model_dir, export_thinker_text(model_dir, self.out / "text", weights=False)

    def run_sglang_alone(self, text_dir: Path, share: float) -> None:
        cmd = [PY, str(ROOT / "bench/sglang_engine_load.py"), "--model-path", str(text_dir), "--concurrency",
               self.args.concurrency, "--max-tokens", str(self.args.max_tokens), "--prompt-set", self.args.prompt_set,
               "--warmup", str(self.args.warmup), "--out", str(self.out / "sglang.json")]
        if self.args.requests:
            cmd += ["--requests", str(self.args.requests)]
        phase = {"system": "sglang", "bench": shlex.join(cmd)}
        self.phases.append(phase)
        limit = min(share, self.left())
        self.log(f"sglang: {phase['bench']} ({limit:.0f}s for it)")
        with open(self.out / "sglang-server.log", "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
                                    env=child_env())
            try:
                rc = proc.wait(timeout=max(5.0, limit))
                phase["status"] = "ok" if rc == 0 else f"failed (rc {rc}): {last_line(self.out / 'sglang-server.log')[:300]}"
            except subprocess.TimeoutExpired:
                phase["status"] = "timed out"
            finally:
                phase["stop"] = kill_group(proc, grace=10)
        self.log(f"sglang: {phase['status']}")

    def run_system(self, system: str, model_dir: Path, text_dir: Path, share: float) -> None:
        if system == "sglang":
            return self.run_sglang_alone(text_dir, share)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = server_command(system, model_dir, text_dir, port, max(self.levels))
        phase = {"system": system, "server": shlex.join(cmd)}
        self.phases.append(phase)
        limit = min(share, self.left())
        self.log(f"{system}: starting ({phase['server']}), {limit:.0f}s for it")
        log = open(self.out / f"{system}-server.log", "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
                                env=child_env())
        t = time.monotonic()
        try:
            while not health_ok(url):
                if proc.poll() is not None or time.monotonic() - t > min(self.args.start_limit_s, limit):
                    phase["status"] = f"server did not come up ({'exited' if proc.poll() is not None else 'timeout'}): " \
                                      f"{last_line(self.out / f'{system}-server.log')[:300]}"
                    self.log(f"{system}: {phase['status']}")
                    return
                time.sleep(2)
            phase["start_s"] = round(time.monotonic() - t, 1)
            self.log(f"{system}: up in {phase['start_s']}s")
            bench = [PY, str(ROOT / "bench/serve.py"), "--url", url, "--concurrency", self.args.concurrency,
                     "--cold", "", "--greedy",  # as SGLang alone: greedy, warm
                     "--max-tokens", str(self.args.max_tokens), "--modalities", "text", "--no-omni-ext",
                     "--prompt-set", self.args.prompt_set, "--warmup", str(self.args.warmup), "--label", system,
                     "--server-note", f"{system}, Qwen3-Omni-30B-A3B thinker text model, random bf16",
                     "--out", str(self.out / f"{system}.json")]
            if self.args.requests:
                bench += ["--requests", str(self.args.requests)]
            phase["bench"] = shlex.join(bench)
            rest = limit - (time.monotonic() - t)
            try:
                rc = subprocess.run(bench, cwd=ROOT, env=child_env(), timeout=max(5.0, rest - 10)).returncode
                phase["status"] = "ok" if rc == 0 else f"bench failed (rc {rc})"
            except subprocess.TimeoutExpired:
                phase["status"] = "bench timed out (partial)"
        finally:
            phase["stop"] = kill_group(proc, grace=15, first=2)  # SIGINT: graceful first
            log.close()
            self.log(f"{system}: {phase.get('status')}; {phase['stop']}")

    def main(self) -> dict:
        model_dir, text_dir = self.model_dirs()
        systems = [s for s in self.args.systems.split(",") if s]
        for i, system in enumerate(systems):
            self.run_system(system, model_dir, text_dir, self.left() / (len(systems) - i))
        # a system measured by an earlier invocation into the same --out-dir (same machine) counts too
        return self.report([s for s in SYSTEMS if s in systems or (self.out / f"{s}.json").exists()])

    def report(self, systems: list[str]) -> dict:
        results = {s: read_json(self.out / f"{s}.json") for s in systems}
        rows = []
        for c in self.levels:
            base = level(results.get("sglang"), c)
            for s in systems:
                lv = level(results.get(s), c)
                if lv is None:
                    continue
                row = {"system": s, "concurrency": c, "ttft_p50_ms": pick(lv, "ttft_ms", "p50"),
                       "tpot_p50_ms": pick(lv, "tpot_ms", "p50"),
                       "output_tok_s": pick(lv, "throughput", "output_tokens_per_s"),
                       "req_s": pick(lv, "throughput", "requests_per_s"), "failed": lv.get("failed")}
                if base is not None and s != "sglang":
                    row["tpot_vs_sglang"] = ratio(row["tpot_p50_ms"], pick(base, "tpot_ms", "p50"))
                    row["throughput_vs_sglang"] = ratio(row["output_tok_s"], pick(base, "throughput", "output_tokens_per_s"))
                    row["ttft_vs_sglang"] = ratio(row["ttft_p50_ms"], pick(base, "ttft_ms", "p50"))
                rows.append(row)
        report = {"command": shlex.join([PY, "bench/sglang_peer.py", *sys.argv[1:]]), "date": now_iso(),
                  "machine": machine(), "gpu": gpu_name(), "phases": self.phases, "rows": rows,
                  "workload": {"prompt_set": self.args.prompt_set, "max_tokens": self.args.max_tokens,
                               "levels": self.levels}}
        old = read_json(self.out / "peer.json")
        if old:  # keep the phases (server commands) of earlier invocations
            report["phases"] = [p for p in old.get("phases", []) if p.get("system") not in systems] + self.phases
        write(report, self.out / "peer.json", self.out / "peer.md", lambda rep: markdown(rep["rows"]) + "\n")
        print(markdown(rows))
        return report


def level(report: dict | None, c: int) -> dict | None:
    """The warm level of concurrency `c` (a report's cold rows are not the peer figures)."""
    for lv in (report or {}).get("levels", []):
        if lv.get("concurrency") == c and lv.get("phase", "warm") == "warm":
            return lv
    return None


def pick(lv: dict, key: str, stat: str):
    value = lv.get(key)
    return value.get(stat) if isinstance(value, dict) else None


def ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def markdown(rows: list[dict]) -> str:
    cols = ["system", "concurrency", "ttft_p50_ms", "tpot_p50_ms", "output_tok_s", "req_s", "failed", "tpot_vs_sglang",
            "throughput_vs_sglang", "ttft_vs_sglang"]
    return "\n".join(md_table(cols, rows))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--requests", type=int, default=None, help="per level (serve.py default: max(2c, 8))")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-set", default="short")
    ap.add_argument("--start-limit-s", type=float, default=300.0)
    ap.add_argument("--budget-s", type=float, default=540.0, help="for the whole run")
    return Peer(ap.parse_args(argv)).main()


if __name__ == "__main__":
    main()
