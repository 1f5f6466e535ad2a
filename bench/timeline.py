"""Where every millisecond goes: a timeline per stage at each concurrency level, for omnid's two
speech families (Qwen3-Omni chat with audio out, Qwen3-TTS speech).

Per level (a closed loop of c clients: bench/serve.py's chat requests, or bench/tts.py's speech
requests) it reads every stage replica's clocks from omnid's /metrics before and after
(`omni_stage_time_seconds_total{stage, part}`: omni/lane_clock.py, omni/stages/gpu_clock.py) and
splits the replica's wall time over the level into

  idle     its loop waited for input (nothing to do)
  feed     the compute thread's round outside stage.step (compute lane - step): handing inputs to the
           stage (open/feed), the payload channel's fence, the stage's stats, the thread hop
  host     inside stage.step, the host's share (step - gpu; all of step off CUDA)
  gpu      inside stage.step, the GPU's span of the step's forwards (CUDA events)
  emit     its loop sending outputs: payload-channel writes, bus sends, credits
  credit   blocked because the consumer has no credits left for it (a slow downstream stage)
  recv     handling inbound messages on the loop thread (overlaps the others: it runs while the
           loop waits), reported beside them

with steps, ms per step and rows per step (tokens or frames per step), and nvidia-smi's own GPU
utilisation over the level (bench/gpu_sampler.py). The busiest stage (least idle) holds the
pipeline back; the others idle waiting for it or for their inputs.

Run:  python bench/timeline.py --family omni|tts (--url URL | --model DIR [--device cuda --dtype bfloat16]
          [--set STAGE.FIELD=VALUE ...]) [--concurrency 1,16,64] [--requests N] [--max-tokens 32]
          [--audio-tokens 64 | --frames 64] [--voice vivian] [--out-dir R] [--label NAME]
Writes R/timeline-LABEL.json and R/timeline-LABEL.md; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import serve as chat  # noqa: E402
import tts  # noqa: E402
from gpu_sampler import GpuSampler  # noqa: E402
from serve_report import machine, now_iso, say, stats  # noqa: E402
from suite_support import child_env, free_port, health_ok, kill_group, last_line  # noqa: E402

LANES = ("idle", "compute", "emit", "credit_wait", "setup")  # they add up to a replica's wall time
COLUMNS = ("idle", "feed", "host", "gpu", "emit", "credit")
# (rows, steps) counters per stage kind: AR engines count tokens (a talker's are frames), vocoders frames
ROWS_PER_STEP = (("num_generated_tokens", "num_steps"), ("decoded_frames", "forwards"))


# ---- reading the clocks -----------------------------------------------------------------
def scrape(url: str) -> dict[str, dict[str, Any]]:
    """{stage replica: {"time_s": {part: s}, gauge name: value}} from omnid's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            stage = sample.labels.get("stage")
            if stage is None or not sample.name.startswith("omni_stage_"):
                continue
            fields = out.setdefault(stage, {"time_s": {}})
            if sample.name == "omni_stage_time_seconds_total":
                fields["time_s"][sample.labels["part"]] = sample.value
            else:
                fields[sample.name.removeprefix("omni_stage_")] = sample.value
    return {stage: f for stage, f in out.items() if f["time_s"]}


def stage_timeline(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """One replica's level: each column's share of its wall time (%), and its steps."""
    d = {k: v - before["time_s"].get(k, 0.0) for k, v in after["time_s"].items()}
    wall = sum(d.get(k, 0.0) for k in LANES)
    step, gpu = d.get("step", 0.0), d.get("gpu")
    seconds = {"idle": d.get("idle", 0.0), "feed": max(0.0, d.get("compute", 0.0) - step),
               "host": max(0.0, step - (gpu or 0.0)), "gpu": gpu, "emit": d.get("emit", 0.0),
               "credit": d.get("credit_wait", 0.0)}
    share = {k: None if v is None or wall <= 0 else round(100 * v / wall, 1) for k, v in seconds.items()}
    steps = after.get("steps", 0.0) - before.get("steps", 0.0)
    row: dict[str, Any] = {"wall_s": round(wall, 3), "share_pct": share,
                           "recv_pct": round(100 * d.get("recv", 0.0) / wall, 1) if wall > 0 else None,
                           "busy_pct": round(100 * (1 - seconds["idle"] / wall), 1) if wall > 0 else None,
                           "steps": int(steps), "ms_per_step": round(1000 * step / steps, 2) if steps else None,
                           "seconds": {k: None if v is None else round(v, 4) for k, v in seconds.items()}}
    if "gpu_reserved_bytes" in after:
        row["gpu_reserved_gb"] = round(after["gpu_reserved_bytes"] / 2**30, 2)
    row["gauges"] = {k: v for k, v in after.items() if k != "time_s"}  # the stage's own stats at the level's end
    for rows_key, steps_key in ROWS_PER_STEP:
        if rows_key in after and steps_key in after:
            n = after[steps_key] - before.get(steps_key, 0.0)
            row["rows_per_step"] = round((after[rows_key] - before.get(rows_key, 0.0)) / n, 2) if n else None
            break
    return row


# ---- the load -----------------------------------------------------------------------------
def level_rows(args, model: str, c: int, n: int, offset: int) -> tuple[list[dict], float]:
    """One closed loop of c clients over n requests: bench/serve.py's chat or bench/tts.py's speech."""
    if args.family == "tts":
        deadline = time.monotonic() + args.level_s
        rows, wall = asyncio.run(tts.closed_loop(args.url, model, args.voice, c, n, args.frames, deadline))
        return [{**r, "latency_s": r.get("wall_s")} for r in rows], wall
    wl = chat.Workload(url=args.url, model=model, prompts=chat.PROMPT_SETS["short"], max_tokens=args.max_tokens,
                       audio_tokens=args.audio_tokens, modalities=["text", "audio"], voice=None, ignore_eos=True,
                       temperature=None, omni_ext=True, sample_rate=24000, timeout_s=args.timeout_s,
                       level_deadline_s=args.level_s)  # the server's own sampling, fixed output lengths
    return asyncio.run(chat.run_level(wl, c, n, offset))


def load_summary(rows: list[dict], wall: float, c: int) -> dict[str, Any]:
    ok = [r for r in rows if r.get("ok")]
    audio = sum(r.get("audio_s") or 0.0 for r in ok)
    return {"concurrency": c, "requests": len(rows), "ok": len(ok), "wall_s": round(wall, 3),
            "ttfa_ms": stats([r.get("ttfa_s") for r in ok], 1000),
            "rtf": stats([r["latency_s"] / r["audio_s"] if r.get("audio_s") else None for r in ok], 1.0, 4),
            "audio_s_per_s": round(audio / wall, 3) if wall > 0 else None,
            "errors": sorted({str(r.get("error"))[:120] for r in rows if not r.get("ok")})[:3]}


def run_levels(args, model: str, on_level=lambda levels: None) -> list[dict]:
    """Every level in turn; `on_level` gets the levels so far after each (the report survives a kill)."""
    if args.warmup:
        say(f"warm-up: {args.warmup} request(s)")
        level_rows(args, model, 1, args.warmup, 10**6)
    levels, offset = [], 0
    for c in args.levels:
        n = args.requests or max(2 * c, 4)
        say(f"c={c}: {n} requests ...")
        before, sampler = scrape(args.url), GpuSampler(args.gpu_sample_ms).start()
        rows, wall = level_rows(args, model, c, n, offset)
        gpu, after = sampler.stop(), scrape(args.url)
        offset += n
        stages = {s: stage_timeline(before[s], after[s]) for s in sorted(after) if s in before}
        level = {**load_summary(rows, wall, c), "gpu": gpu, "stages": stages}
        busiest = max(stages, key=lambda s: stages[s]["busy_pct"] or 0.0, default=None)
        level["busiest_stage"] = busiest
        levels.append(level)
        say(f"  ok {level['ok']}/{n} in {wall:.2f}s, audio {level['audio_s_per_s']} s/s; busiest {busiest} "
            f"({stages[busiest]['busy_pct'] if busiest else None}% busy)")
        on_level(levels)
    return levels


# ---- omnid --------------------------------------------------------------------------------
def start_omnid(args, out: Path) -> subprocess.Popen:
    """`omnid serve` on a free port, healthy within `args.start_s` (else SystemExit with its log's last line)."""
    port = free_port()
    args.url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "omni.api.cli", "serve", "--port", str(port), "--mode", "process"]
    cmd += (["--model", args.model] if args.model else []) + (["--device", args.device] if args.device else [])
    cmd += (["--dtype", args.dtype] if args.dtype else []) + [x for s in args.set for x in ("--set", s)]
    log = out / f"omnid-{args.label}.log"
    say(f"omnid: {' '.join(cmd)}")
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=ROOT, env=child_env())
    t0 = time.monotonic()
    while time.monotonic() - t0 < args.start_s:
        if proc.poll() is not None:
            raise SystemExit(f"omnid exited rc {proc.returncode}: {last_line(log)}")
        if health_ok(args.url):
            args.start_took_s = round(time.monotonic() - t0, 1)
            say(f"omnid healthy in {args.start_took_s}s")
            return proc
        time.sleep(1.0)
    kill_group(proc, 10)
    raise SystemExit(f"omnid not healthy after {args.start_s:.0f}s: {last_line(log)}")


# ---- the report ---------------------------------------------------------------------------
def _f(value: Any, suffix: str = "") -> str:
    return "–" if value is None else f"{value:g}{suffix}"


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Stage timeline: {report['family']} ({report['model']}), {report['when']}", "",
             "Shares of each replica's wall time over the level (%); they add up to 100 with the `setup` lane "
             "(0 once serving). recv overlaps the others. host = step - gpu (all of step off CUDA).", ""]
    for lv in report["levels"]:
        ttfa, rtf = lv["ttfa_ms"] or {}, lv["rtf"] or {}
        gpu = "; ".join(f"{g} util mean {v['util_mean']}% p50 {v['util_p50']}% max {v['util_max']}%, "
                        f"mem {v['mem_used_max_mib']:.0f} MiB" for g, v in (lv["gpu"] or {}).items()) or "no nvidia-smi"
        lines += [f"## c={lv['concurrency']}: {lv['ok']}/{lv['requests']} ok in {lv['wall_s']} s, TTFA p50 "
                  f"{_f(ttfa.get('p50'))} ms (p90 {_f(ttfa.get('p90'))}), RTF p50 {_f(rtf.get('p50'))} (p90 {_f(rtf.get('p90'))}), "
                  f"{_f(lv['audio_s_per_s'])} audio s/s", "",
                  f"GPU: {gpu}. Busiest stage: {lv['busiest_stage']}.", "",
                  "| stage | " + " | ".join(COLUMNS) + " | recv | busy | steps | ms/step | rows/step | GPU reserved GB |",
                  "|---" * (len(COLUMNS) + 7) + "|"]
        for stage, row in lv["stages"].items():
            cells = [_f(row["share_pct"][k]) for k in COLUMNS]
            lines.append(f"| {stage} | " + " | ".join(cells) + f" | {_f(row['recv_pct'])} | {_f(row['busy_pct'])} | "
                         f"{row['steps']} | {_f(row['ms_per_step'])} | {_f(row.get('rows_per_step'))} | "
                         f"{_f(row.get('gpu_reserved_gb'))} |")
        lines.append("")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=("omni", "tts"), default="omni", help="chat with audio out, or speech")
    ap.add_argument("--url", default=None, help="a running omnid (default: start one)")
    ap.add_argument("--model", default=None, help="omnid serve --model (default: its embedded default model)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--set", action="append", default=[], metavar="STAGE.FIELD=VALUE", help="omnid --set (repeat)")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--requests", type=int, default=None, help="per level (default max(2c, 4))")
    ap.add_argument("--warmup", type=int, default=2, help="requests at c=1 before the levels")
    ap.add_argument("--max-tokens", type=int, default=32, help="thinker tokens per chat request")
    ap.add_argument("--audio-tokens", type=int, default=64, help="talker frames per chat request")
    ap.add_argument("--frames", type=int, default=64, help="frames per speech request")
    ap.add_argument("--voice", default="vivian", help="speech voice")
    ap.add_argument("--level-s", type=float, default=90.0, help="no new request past this many seconds of a level")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--start-s", type=float, default=300.0, help="omnid start limit")
    ap.add_argument("--gpu-sample-ms", type=int, default=200)
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--label", default=None, help="the report's name (default: the family)")
    return ap


def run(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    args.levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    args.label = args.label or args.family
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    proc = start_omnid(args, out) if args.url is None else None
    report: dict[str, Any] = {}

    def write(levels: list[dict]) -> None:
        report.update({"when": now_iso(), "machine": machine(), "argv": sys.argv if argv is None else argv,
                       "family": args.family, "model": model, "start_s": getattr(args, "start_took_s", None),
                       "levels": levels})
        (out / f"timeline-{args.label}.json").write_text(json.dumps(report, indent=2) + "\n")
        (out / f"timeline-{args.label}.md").write_text(markdown(report))

    try:
        model = asyncio.run(chat.detect_model(args.url, None))
        write(run_levels(args, model, write))
    finally:
        if proc is not None:
            say(f"omnid: {kill_group(proc, 20)}")
    print(markdown(report))
    return report


if __name__ == "__main__":
    run()
