"""Issue 17's serving run: a fresh omnid on the full-size Qwen3-Omni with random bf16 weights, started
exactly as bench/gpu_suite.py starts it (every model stage on the GPU, CUDA graphs up to the largest
level, its KV and attention settings), under bench/realtime.py: the cold level first, the warm levels
at the server's own turn detection, then (with `--short-silence-ms`, when time is left) one extra
warm level with that server_vad silence_duration_ms set by the client, reported apart. omnid's
process group is stopped whatever happens; every phase has a time limit inside `--budget-s`.

Run:  python bench/realtime_suite.py --out-dir OUT [--sessions 1,8,32] [--budget-s 480] [--scaled]
          [--short-silence-ms 200 --short-sessions 8] [--omnid-arg=--mps=on] -- [more bench/realtime.py args]
Writes OUT/realtime.{json,md} (and realtime_short.*), OUT/suite.json (phases, commands), omnid.log.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from gpu_suite import PY, Suite, build_parser as suite_parser  # noqa: E402
from report import now_iso  # noqa: E402
from suite_support import gpu_name  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--sessions", default="1,8,32", help="bench/realtime.py's warm levels")
    ap.add_argument("--cold", default="1", help="its cold levels (the fresh server's first)")
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--start-limit-s", type=float, default=180.0)
    ap.add_argument("--kv-blocks", type=int, default=4096, help="of thinker and talker (16 tokens each)")
    ap.add_argument("--short-silence-ms", type=int, default=None, help="the extra level's silence_duration_ms")
    ap.add_argument("--short-sessions", default="8")
    ap.add_argument("--short-min-s", type=float, default=90.0, help="run the extra level only with this much left")
    ap.add_argument("--scaled", action="store_true", help="CPU, the scaled config (a dry run)")
    ap.add_argument("--label", default="omni-realtime")
    ap.add_argument("--omnid-arg", action="append", default=[], metavar="ARG")
    ap.add_argument("--set", dest="extra_set", action="append", default=[], metavar="STAGE.FIELD=VALUE")
    ap.add_argument("bench", nargs="*", help="after --: more bench/realtime.py arguments")
    return ap


def main(argv: list[str] | None = None) -> dict:
    from omni.models.qwen3_omni.checkpoint.presets_full import scaled_config, write_random_model_dir

    a = build_parser().parse_args(argv)
    out = Path(a.out_dir)
    levels = ",".join(x for x in (a.sessions, a.cold, a.short_sessions if a.short_silence_ms else "") if x)
    suite = Suite(suite_parser().parse_args(
        ["--out-dir", str(out), "--no-hf", "--label", a.label, "--concurrency", levels, "--cold", "",
         "--greedy-levels", "", "--kv-blocks", str(a.kv_blocks), "--budget-s", str(a.budget_s),
         "--start-limit-s", str(a.start_limit_s), *(["--scaled"] if a.scaled else []),
         *(f"--omnid-arg={x}" for x in a.omnid_arg), *(x for s in a.extra_set for x in ("--set", s))]))
    suite.gpu = gpu_name()
    note = "omnid, scaled config (CPU)" if a.scaled else "omnid on the GPU, Qwen3-Omni-30B-A3B random bf16 weights"
    work = Path(tempfile.mkdtemp(prefix="omni-rt-"))

    def bench(name: str, extra: list[str], limit: float) -> None:
        cmd = [PY, "bench/realtime.py", "--url", suite.url, "--label", f"{a.label}{name[8:]}",
               "--server-note", f"{note}; omnid command in suite.json", "--out", str(out / f"{name}.json"),
               "--md", str(out / f"{name}.md"), *a.bench, *extra]
        suite.run(name, cmd, limit)

    def on_term(signum, frame):  # `timeout` sends SIGTERM: stop omnid, keep what exists
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    try:
        model_dir = write_random_model_dir(work / "model", scaled_config() if a.scaled else None)
        if suite.start_omnid(model_dir):
            reserve = suite.args.stop_limit_s + (a.short_min_s if a.short_silence_ms else 0.0)
            bench("realtime", ["--sessions", a.sessions, "--cold", a.cold], suite.limit(1e9, reserve))
            if a.short_silence_ms and suite.left() - suite.args.stop_limit_s >= a.short_min_s:
                bench("realtime_short", ["--sessions", a.short_sessions, "--cold", "", "--warmup-turns", "0",
                                         "--silence-ms", str(a.short_silence_ms)],
                      suite.limit(1e9, suite.args.stop_limit_s))
    except BaseException as exc:
        suite.phases.append({"name": "suite", "status": f"aborted: {type(exc).__name__}: {exc}"})
        raise
    finally:
        suite.stop_omnid()
        shutil.rmtree(work, ignore_errors=True)
        rep = {"date": now_iso(), "label": a.label, "gpu": suite.gpu, "omnid_sets": suite.omnid_sets(),
               "omnid_args": a.omnid_arg, "phases": suite.phases, "commands": suite.commands}
        (out / "suite.json").write_text(json.dumps(rep, indent=2) + "\n")
    return rep


if __name__ == "__main__":
    main()
