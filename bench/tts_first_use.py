"""Where a warm Qwen3-TTS request's slow first audio goes: a diagnostic probe, not a benchmark.

bench/tts.py saw one warm c=1 request of the named voice take 700-900 ms to its first audio where
the others take 60-110 ms (calls 6 and 7 of 2026-12-02, bench/RESULTS.md), always a text first
spoken alone after the warm burst. This serves the same graph in this process (the kernel inline,
the HTTP app on it), runs bench/tts.py's request sequence (fresh, burst, three c=1 rounds) and
records every stage round slower than 30 ms (stage, time in its inputs vs its step, the requests
live), the talker engine's slow parts (prepare, forward, code predictor) and Python GC pauses, then
prints them beside each request's time to first audio.

Run:  python bench/tts_first_use.py --out-dir R [--kind custom_voice|base] [--device cuda]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from tts import VOICE, closed_loop, test_clip, upload_voice  # noqa: E402

EVENTS: list[dict] = []


def _record(kind: str, t0: float, **fields) -> None:
    ms = (time.perf_counter() - t0) * 1000
    if ms > fields.pop("over_ms", 30.0):
        EVENTS.append({"t": time.monotonic(), "what": kind, "ms": round(ms, 1), **fields})


def instrument_driver() -> None:
    from omni.kernel import driver

    run_once, apply = driver.StageDriver.run_once, driver.StageDriver._apply

    def timed_run_once(self):
        t0, self.apply_s = time.perf_counter(), 0.0
        out = run_once(self)
        _record("round", t0, stage=self.spec.name, inputs_ms=round(self.apply_s * 1000, 1), live=len(self._live))
        return out

    def timed_apply(self, item, emits):
        t0 = time.perf_counter()
        apply(self, item, emits)
        self.apply_s += time.perf_counter() - t0

    driver.StageDriver.run_once, driver.StageDriver._apply = timed_run_once, timed_apply
    pauses: dict[int, float] = {}

    def on_gc(phase, info):
        if phase == "start":
            pauses[info["generation"]] = time.perf_counter()
        elif info["generation"] in pauses:
            _record("gc", pauses.pop(info["generation"]), over_ms=10.0, generation=info["generation"])

    gc.callbacks.append(on_gc)


def instrument_talker(stage) -> None:
    """Time the engine's parts on the live talker stage object (inline: it is in this process)."""
    import torch

    engine = stage.engine

    def wrap(obj, name: str, label: str, sync: bool) -> None:
        inner = getattr(obj, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            out = inner(*a, **k)
            if sync:
                torch.cuda.synchronize()
            _record(label, t0, over_ms=20.0)
            return out

        setattr(obj, name, timed)

    sync = str(engine.config.device).startswith("cuda")
    wrap(engine.runner, "prepare", "talker.prepare", False)
    wrap(engine.runner, "run", "talker.forward", sync)
    profile_eager_forwards(engine.runner, sync)
    wrap(engine.model, "after_sample", "talker.code_predictor", sync)
    wrap(engine.model, "new_tts_request", "talker.prompt", sync)


def profile_eager_forwards(runner, sync: bool) -> None:
    """Profile every eager forward (prefills: decode steps replay graphs); keep the op table of a slow
    one, with the allocator's retries (a cudaMalloc that had to free the cache first) around it."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    inner = runner.model.forward

    def forward(batch):
        stats0 = torch.cuda.memory_stats() if sync else {}
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if sync else [])) as prof:
            out = inner(batch)
            if sync:
                torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1000
        if ms > 150:
            stats1 = torch.cuda.memory_stats() if sync else {}
            delta = {k: stats1.get(k, 0) - stats0.get(k, 0) for k in ("num_alloc_retries", "num_device_alloc",
                                                                      "num_device_free")}
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
            EVENTS.append({"t": time.monotonic(), "what": "talker.eager_forward", "ms": round(ms, 1),
                           "rows": int(batch.input_ids.numel()), "allocator": delta})
            print(f"slow eager forward {ms:.0f} ms, {int(batch.input_ids.numel())} rows, allocator {delta}\n{table}",
                  flush=True)
        return out

    runner.model.forward = forward


async def main_async(args) -> dict:
    from omni.api.app import build_app
    from omni.api.state import ServerConfig
    from omni.api.server import HttpServer
    from omni.kernel.kernel import Kernel
    from omni.models.qwen3_tts.checkpoint.make_tiny import make_tiny
    from omni.models.qwen3_tts.graph import build

    out = Path(args.out_dir)
    model_dir = make_tiny(out / f"qwen3-tts-{args.kind}", args.kind, args.preset, seed=0, device=args.device)
    talker = {"cuda_graphs": True, "max_num_seqs": 16, "cuda_graph_max_batch": 16, "max_model_len": 4096}
    graph, info = build(model_dir, device=args.device, dtype="bfloat16",
                        stage_args={"talker": talker} if args.device.startswith("cuda") else {})
    instrument_driver()
    kernel = Kernel(graph, mode="inline")
    t0 = time.monotonic()
    await kernel.start()
    print(f"kernel up in {time.monotonic() - t0:.1f} s", flush=True)
    instrument_talker(kernel.supervisor.handles["talker.0"].process.actor.driver.stage)
    server = await HttpServer(build_app(kernel, info, [s.name for s in graph.stages], ServerConfig(port=0)),
                              "127.0.0.1", 0).start()
    model, voice, deadline = info.id, VOICE[args.kind], time.monotonic() + args.budget_s
    phases: list[tuple[str, list]] = []
    try:
        if args.kind == "base":
            await asyncio.to_thread(upload_voice, server.url, voice, test_clip())
        for name, c, n in [("fresh", 1, 1), ("fresh 2nd", 1, 1), ("burst", 16, 16), ("c=1 a", 1, 4),
                           ("c=1 b", 1, 4), ("c=1 c", 1, 4)]:
            EVENTS.append({"t": time.monotonic(), "what": f"--- {name}"})
            rows, _ = await closed_loop(server.url, model, voice, c, n, args.frames, deadline)
            phases.append((name, rows))
            talker = (await kernel.stats())["talker.0"]
            print(f"after {name}: talker", {k: v for k, v in talker.items() if "graph" in k or k == "shapes"},
                  flush=True)
    finally:
        await server.stop()
        await kernel.stop()
    report = []
    for name, rows in phases:
        for row in sorted(rows, key=lambda r: r.get("t0", 0)):
            start = row.get("t0", 0)
            first = start + row.get("ttfa_s", 0)
            during = [e for e in EVENTS if start <= e["t"] <= first + 0.005 and not e["what"].startswith("---")]
            report.append({"phase": name, "text": row.get("i"), "ttfa_ms": round(row.get("ttfa_s", 0) * 1000, 1),
                           "slow_before_first_audio": [{k: v for k, v in e.items() if k != "t"} for e in during]})
    return {"kind": args.kind, "preset": args.preset, "device": args.device, "requests": report}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--kind", default="custom_voice")
    ap.add_argument("--preset", default="full-1.7b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--budget-s", type=float, default=240.0)
    args = ap.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = asyncio.run(main_async(args))
    Path(args.out_dir, f"first_use_{args.kind}.json").write_text(json.dumps(result, indent=1))
    for r in result["requests"]:
        slow = "; ".join(f"{e['what']}{'/' + e['stage'] if 'stage' in e else ''} {e['ms']} ms"
                         + (f" (inputs {e['inputs_ms']})" if e.get("inputs_ms") else "")
                         for e in r["slow_before_first_audio"])
        print(f"{r['phase']:10} text {r['text']}: TTFA {r['ttfa_ms']:7.1f} ms  {slow}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
