"""Qwen3-Omni (tiny, random weights) on CPU: omni's multi-process graph against transformers' `generate`.

One run, the same prompts (text-only, audio input, image input; greedy thinker and talker, so both
sides compute the same tokens, codes and waveforms, which the run checks):
- transformers: `Qwen3OmniMoeForConditionalGeneration.generate(return_audio=True)`, one request at a
  time (it has no request concurrency); its first audio is its whole waveform, at the end.
- omni: the speech graph, one OS process per stage (preprocess, 2 encoders, thinker, talker,
  code2wav), requests submitted with 1, 4 and 16 in flight; audio streams from code2wav in chunks.
Reported per setting: requests/s, time to first audio chunk (TTFA) and real-time factor (RTF =
seconds of work per second of audio, lower is better) as medians over the requests, and the
throughput RTF (wall time / all audio seconds).

Run:  .venv/bin/python bench/qwen3_omni_cpu.py [--preset tiny-c --seed 3] [--quick]
      [--out bench/results/qwen3_omni_cpu.json] [--md bench/RESULTS_qwen3_cpu.md]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]
os.chdir(ROOT)  # stage processes run `python -m omni.cluster.proc` from the repository root

from omni.kernel.kernel import Kernel  # noqa: E402
from omni.models.qwen3_omni.graph import build  # noqa: E402
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny  # noqa: E402
from qwen3_fixtures import Oracle, params, prompts  # noqa: E402
from report import machine, write  # noqa: E402

VOICES = ["ethan", "chelsie", "aiden"]


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def workload(n: int) -> list[tuple[str, str]]:
    """(prompt kind, voice) of `n` requests, cycling through the prompts and voices."""
    kinds = list(prompts())
    return [(kinds[i % len(kinds)], VOICES[(i // len(kinds)) % len(VOICES)]) for i in range(n)]


def summary(rows: list[dict[str, Any]], wall: float, concurrency: int | None) -> dict[str, Any]:
    audio = sum(r["audio_s"] for r in rows)
    return {
        "concurrency": concurrency,
        "requests": len(rows),
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(rows) / wall, 3),
        "ttfa_p50_ms": round(1000 * statistics.median(r["ttfa_s"] for r in rows), 1),
        "ttfa_max_ms": round(1000 * max(r["ttfa_s"] for r in rows), 1),
        "latency_p50_ms": round(1000 * statistics.median(r["latency_s"] for r in rows), 1),
        "rtf_p50": round(statistics.median(r["latency_s"] / r["audio_s"] for r in rows), 3),
        "throughput_rtf": round(wall / audio, 3),
        "audio_s_per_request": round(audio / len(rows), 3),
    }


# ---- transformers ---------------------------------------------------------------------------

def run_transformers(oracle: Oracle, reqs, args) -> tuple[dict[str, Any], dict]:
    msgs = prompts()
    outputs, rows = {}, []
    oracle.generate(msgs["text"], "ethan", args.thinker_tokens, args.talker_tokens)  # warm-up
    t_all = time.perf_counter()
    for i, (kind, voice) in enumerate(reqs):
        t0 = time.perf_counter()
        ref = oracle.generate(msgs[kind], voice, args.thinker_tokens, args.talker_tokens)
        took = time.perf_counter() - t0
        outputs[(kind, voice)] = ref
        rows.append({"ttfa_s": took, "latency_s": took, "audio_s": len(ref.wav) / 24000})
        say(f"  transformers {i + 1}/{len(reqs)}: {kind:5s} {took * 1000:7.1f} ms, {rows[-1]['audio_s']:.2f} s audio")
    return summary(rows, time.perf_counter() - t_all, None), outputs


# ---- omni -----------------------------------------------------------------------------------

async def omni_request(kernel: Kernel, p: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    first, tokens, pcm = None, [], []
    async for ev in kernel.submit(p):
        if ev.port == "audio":
            first = first or time.perf_counter()
            pcm.append(np.asarray(ev.data["pcm"], dtype=np.float32))
        elif ev.port == "text":
            tokens += ev.data["token_ids"]
    end = time.perf_counter()
    wav = np.concatenate(pcm) if pcm else np.zeros(0, np.float32)
    return {"ttfa_s": (first or end) - t0, "latency_s": end - t0, "audio_s": len(wav) / 24000, "tokens": tokens,
            "wav": wav}


async def omni_level(kernel: Kernel, reqs, concurrency: int, args) -> tuple[dict[str, Any], list[dict]]:
    msgs, gate, done = prompts(), asyncio.Semaphore(concurrency), []

    async def one(kind: str, voice: str) -> dict[str, Any]:
        async with gate:
            row = await omni_request(kernel, params(msgs[kind], voice, args.thinker_tokens, args.talker_tokens))
            done.append(row)
            if len(done) % max(1, len(reqs) // 4) == 0:
                say(f"  omni c={concurrency}: {len(done)}/{len(reqs)} done")
            return {**row, "kind": kind, "voice": voice}

    t0 = time.perf_counter()
    rows = await asyncio.gather(*(one(kind, voice) for kind, voice in reqs))
    return summary(rows, time.perf_counter() - t0, concurrency), rows


async def run_omni(ckpt: str, levels, args) -> tuple[list[dict[str, Any]], list[dict], float]:
    graph, _ = build(ckpt, first_chunk_frames=args.first_chunk_frames)
    kernel = Kernel(graph, mode="process", env={"TOKENIZERS_PARALLELISM": "false"}, max_inflight=max(levels))
    t0 = time.perf_counter()
    await kernel.start()
    start_s = time.perf_counter() - t0
    say(f"  omni: {len(graph.stages)} stage processes up in {start_s:.1f} s")
    results, all_rows = [], []
    try:
        await omni_request(kernel, params(prompts()["text"], "ethan", args.thinker_tokens, args.talker_tokens))
        for c in levels:
            result, rows = await omni_level(kernel, workload(args.requests_per_level * c if c > 1 else
                                                             args.requests_alone), c, args)
            say(f"  omni c={c}: {result['requests_per_s']} req/s, TTFA p50 {result['ttfa_p50_ms']} ms, "
                f"RTF p50 {result['rtf_p50']}")
            results.append(result)
            all_rows += rows
    finally:
        await kernel.stop()
    return results, all_rows, start_s


def check_parity(rows: list[dict], refs: dict) -> dict[str, Any]:
    """Every omni output against transformers' for the same (prompt, voice)."""
    same_tokens, worst = 0, 0.0
    for r in rows:
        ref = refs[(r["kind"], r["voice"])]
        same_tokens += r["tokens"] == ref.tokens
        if r["wav"].shape == ref.wav.shape:
            worst = max(worst, float(np.abs(r["wav"] - ref.wav).max() / np.abs(ref.wav).max()))
        else:
            worst = float("inf")
    return {"requests": len(rows), "tokens_equal": same_tokens, "max_wave_diff_over_peak": worst}


def markdown(report: dict[str, Any]) -> str:
    m, cfg = report["machine"], report["config"]
    lines = ["## Qwen3-Omni on CPU: omni vs transformers", "",
             f"Command: `{report['command']}`  ", f"Date: {report['date']}  ",
             f"Machine: {m.get('cpu_model') or m['processor']}, {m['cpu_count']} CPUs, {m['platform']}, "
             f"torch {m.get('torch', '?')}; 1-minute load average {m['load_avg_1m_at_start']} at the start, "
             f"{m['load_avg_1m_at_end']} at the end (a shared machine)", "",
             f"Model: tiny random Qwen3-Omni (`make_tiny` preset {cfg['preset']}, seed {cfg['seed']}): "
             f"{cfg['thinker_tokens']} thinker tokens and up to {cfg['talker_tokens']} talker frames per request, "
             f"greedy; prompts cycle text-only / audio input / image input. omni: {cfg['omni_stages']} stage "
             f"processes, {cfg['omni_threads_per_stage']} torch thread(s) each, vocoder first chunk "
             f"{cfg['first_chunk_frames']} frames, started in "
             f"{report['omni_start_s']} s. transformers: `generate`, {cfg['hf_threads']} torch thread(s), one "
             "request at a time.", "",
             "| engine | in flight | requests | req/s | TTFA p50 (ms) | TTFA max (ms) | latency p50 (ms) | RTF p50 "
             "| throughput RTF |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in [("transformers", report["transformers"])] + [("omni", r) for r in report["omni"]]:
        lines.append(f"| {name} | {r['concurrency'] or 1} | {r['requests']} | {r['requests_per_s']} | "
                     f"{r['ttfa_p50_ms']} | {r['ttfa_max_ms']} | {r['latency_p50_ms']} | {r['rtf_p50']} | "
                     f"{r['throughput_rtf']} |")
    p = report["parity"]
    lines += ["", f"Outputs: {p['tokens_equal']}/{p['requests']} omni requests gave transformers' exact tokens; "
              f"largest waveform difference {p['max_wave_diff_over_peak']:.2e} of the peak.", "",
              "TTFA: submit to the first audio chunk (transformers returns its whole waveform at the end). RTF: "
              "seconds from submit to the last chunk per second of audio (< 1 is faster than real time); "
              "throughput RTF: wall time of the run per second of all audio made. The tiny model's compute is "
              "small, so these numbers measure per-step overheads (Python, IPC, scheduling) more than math: "
              "they are not a forecast for the real 30B model."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # tiny-c upsamples 1920x like the real code2wav (12.5 frames per second of audio) and has its 16 code
    # groups; with seed 3 the random talker speaks every prompt to max_tokens (a random talker often stops early)
    parser.add_argument("--preset", default="tiny-c")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests-alone", type=int, default=9, help="requests at concurrency 1 (each engine)")
    parser.add_argument("--requests-per-level", type=int, default=3, help="x concurrency requests per level > 1")
    parser.add_argument("--thinker-tokens", type=int, default=24)
    parser.add_argument("--talker-tokens", type=int, default=100)
    parser.add_argument("--first-chunk-frames", type=int, default=4)
    parser.add_argument("--hf-threads", type=int, default=1, help="torch threads of transformers (omni: 1 per stage)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few requests")
    parser.add_argument("--out", default=str(ROOT / "bench/results/qwen3_omni_cpu.json"))
    parser.add_argument("--md", default=str(ROOT / "bench/RESULTS_qwen3_cpu.md"))
    args = parser.parse_args(argv)
    if args.quick:
        args.requests_alone, args.requests_per_level = 3, 1
    import torch

    torch.set_num_threads(args.hf_threads)
    report: dict[str, Any] = {
        "command": " ".join([os.path.relpath(sys.executable, ROOT)] + sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "md")},
    }
    load_at_start = round(os.getloadavg()[0], 2)  # the box may be shared: say how busy it was
    with tempfile.TemporaryDirectory(prefix="omni-bench-") as tmp:
        ckpt = str(make_tiny(Path(tmp) / args.preset, seed=args.seed, preset=args.preset))
        stages = build(ckpt)[0].stages
        report["config"]["omni_stages"] = len(stages)
        report["config"]["omni_threads_per_stage"] = stages[0].args["threads"]  # the graph's default share
        say(f"[transformers] preset {args.preset}, {args.hf_threads} thread(s)")
        refs_needed = workload(max(args.requests_alone, args.requests_per_level * max(args.concurrency)))
        oracle = Oracle(ckpt)
        hf_result, refs = run_transformers(oracle, workload(args.requests_alone), args)
        for key in set(refs_needed) - set(refs):  # references for requests only the concurrent levels use
            refs[key] = oracle.generate(prompts()[key[0]], key[1], args.thinker_tokens, args.talker_tokens)
        report["transformers"] = hf_result
        say(f"  transformers: {hf_result['requests_per_s']} req/s, RTF p50 {hf_result['rtf_p50']}")
        say(f"[omni] concurrency {args.concurrency}")
        report["omni"], rows, report["omni_start_s"] = asyncio.run(run_omni(ckpt, args.concurrency, args))
        report["omni_start_s"] = round(report["omni_start_s"], 2)
        report["parity"] = check_parity(rows, refs)
    report["machine"] = {**machine(), "load_avg_1m_at_start": load_at_start,
                         "load_avg_1m_at_end": round(os.getloadavg()[0], 2)}
    write(report, args.out, args.md, markdown)
    say(f"wrote {args.out} and {args.md}")
    return report


if __name__ == "__main__":
    main()
