"""The equal-work load on omni's built-in AR engine, in this process (the counterpart of
bench/sglang_engine_load.py, which drives SGLang's offline Engine).

The model is a Qwen3-MoE text checkpoint on disk (omni/models/qwen3_omni/checkpoint/text_checkpoint.py),
loaded into `Qwen3OmniThinker` (the module omni's thinker stage runs) with `load_text_thinker`:
the same tensors SGLang loads from the same directory. Requests: distinct random prompts
(equal_work_support.distinct_prompt: request i gets its own token ids, the same ones SGLang gets),
greedy, `max_tokens` output tokens with ignore_eos; closed loop of c clients per level (a
client submits its next request in the step after its last one ended). The engine steps in
this thread; each step ends with the sampled ids on the host, so a token's time is when that
step returned. TPOT = (last token - first token) / (tokens - 1), as serve.py and SGLang's driver.

Start-up and warm-up before the levels: the engine's `warmup()` captures every decode graph (as
omnid does before /health; SGLang captures at start too), then each level runs once with 4-token
requests (prefill shapes, kernel compiles). An engine without start-up capture gets every batch
bucket warmed instead.

Run:  python bench/omni_engine_load.py --model-path DIR [--device cuda] [--concurrency 1,16,64]
          [--max-tokens 128] [--prompt-len 32] [--seed 0] [--out omni.json] [--tokens-out omni_tokens.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from equal_work_support import distinct_prompt  # noqa: E402
from serve_report import level_summary, machine, now_iso, say  # noqa: E402


def engine_config(device: str, levels: list[int], prompt_len: int, max_tokens: int, extra: dict[str, Any]):
    from omni.stages.ar.config import EngineConfig

    seqs = max(levels)
    per_seq = -(-(prompt_len + max_tokens + 16) // 16)
    args = {"block_size": 16, "num_blocks": seqs * per_seq + 64, "max_num_seqs": seqs,
            "max_model_len": per_seq * 16, "max_num_batched_tokens": max(2048, seqs * prompt_len), "device": device,
            "eos_token_ids": (151645,), "enable_prefix_caching": False}  # equal work: SGLang's radix cache is off too
    if device.startswith("cuda"):
        args.update(cuda_graphs=True, cuda_graph_max_batch=seqs, attention_backend="triton")
    return EngineConfig(**{**args, **extra})


def closed_loop(engine, prompt, max_tokens: int, concurrency: int, n: int, offset: int, tag: str = "r"):
    """(rows in serve.py's format, wall seconds, per-request token records) for one level."""
    from omni.stages.ar.sequence import SamplingParams

    todo = iter(range(offset, offset + n))
    active: dict[str, dict] = {}
    done: list[dict] = []
    t0 = time.perf_counter()

    def submit() -> None:
        i = next(todo, None)
        if i is None:
            return
        rid = f"{tag}{i}"
        st = {"index": i, "t_submit": time.perf_counter() - t0, "t_tokens": [], "output_ids": [], "error": None}
        try:
            engine.add_request(rid, prompt(i), SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
            active[rid] = st
        except Exception as exc:  # a failed request is a row
            st["error"] = f"{type(exc).__name__}: {exc}"
            done.append(st)

    for _ in range(concurrency):
        submit()
    while active:
        outs = engine.step()
        now = time.perf_counter() - t0
        if not outs and not engine.has_unfinished():
            for st in active.values():
                st["error"] = "engine has no work for it"
                done.append(st)
            active.clear()
            break
        for o in outs:
            st = active.get(o.rid)
            if st is None:
                continue
            for tok in o.new_token_ids:
                st["output_ids"].append(int(tok))
                st["t_tokens"].append(now)
            if o.error:
                st["error"] = o.error
            if o.finished or o.error:
                done.append(active.pop(o.rid))
                submit()
    wall = time.perf_counter() - t0
    done.sort(key=lambda st: st["index"])
    rows = []
    for st in done:
        times = st["t_tokens"]
        ok = st["error"] is None and len(st["output_ids"]) == max_tokens
        rows.append({"index": st["index"], "ok": ok, "error": st["error"] or (None if ok else "short output"),
                     "ttft_s": times[0] - st["t_submit"] if times else None,
                     "tpot_s": (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None,
                     "ttfa_s": None, "audio_s": None, "output_tokens": len(st["output_ids"]),
                     "latency_s": (times[-1] if times else wall) - st["t_submit"]})
    return rows, wall, [{k: st[k] for k in ("index", "output_ids", "t_submit", "t_tokens")} for st in done]


def warm(engine, prompt, levels: list[int], buckets: list[int]) -> float:
    t = time.perf_counter()
    for k, c in enumerate([*levels, *buckets]):
        closed_loop(engine, lambda i: prompt(10**6 + 1000 * k + i), 4, c, c, 0, tag=f"w{k}-")
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", required=True, help="a Qwen3-MoE checkpoint dir (text_checkpoint.py)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--requests", type=int, default=None, help="per level (default max(2c, 8))")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0, help="of the prompts")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false")
    ap.add_argument("--engine-args", default="{}", help="JSON of EngineConfig overrides")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tokens-out", default=None, help="token streams and times (for bench/expert_hits.py)")
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]

    import torch

    from omni.models.qwen3_omni.checkpoint.text_checkpoint import load_text_thinker
    from omni.stages.ar.engine import AREngine

    try:
        from omni.stages.ar.cuda_graphs import batch_buckets
    except ImportError:  # the engine's bucket rule moved: warm the usual ones
        def batch_buckets(m: int) -> list[int]:
            return sorted({b for b in (1, 2, 4, 8) if b < m} | set(range(16, m, 8)) | {m})

    if args.device == "cpu":
        torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    t0 = time.perf_counter()
    model = load_text_thinker(args.model_path, args.device, getattr(torch, args.dtype))
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    cfg = engine_config(args.device, levels, args.prompt_len, args.max_tokens, json.loads(args.engine_args))
    engine = AREngine(model, cfg)
    vocab = model.cfg.text.vocab_size
    prompt = lambda i: distinct_prompt(i, args.prompt_len, args.seed, vocab)  # noqa: E731
    say(f"omni engine: model loaded in {load_s:.1f}s ({sum(p.numel() for p in model.parameters()) / 1e9:.2f}B "
        f"params); engine {cfg}")
    t = time.perf_counter()
    captured = engine.warmup() if hasattr(engine, "warmup") else 0  # every decode graph, as omnid's start-up
    capture_s = time.perf_counter() - t
    say(f"start-up capture: {captured} decode graphs in {capture_s:.1f}s")
    buckets = batch_buckets(max(levels)) if cfg.graphs_on and not captured else []  # else lazily, here
    warm_s = warm(engine, prompt, levels, buckets) if args.warmup else 0.0
    say(f"warm-up {warm_s:.1f}s; engine stats {engine.stats()}")
    summaries, records, offset = [], [], 0
    for c in levels:
        n = args.requests or max(2 * c, 8)
        rows, wall, recs = closed_loop(engine, prompt, args.max_tokens, c, n, offset)
        offset += n
        summary = {"phase": "warm", **level_summary(rows, wall, c)}
        summaries.append(summary)
        records.append({"phase": "warm", "concurrency": c, "requests": recs})
        say(f"c={c}: ok {summary['ok']}/{n} in {wall:.2f}s; tpot p50 {(summary['tpot_ms'] or {}).get('p50')} ms; "
            f"e2e p50 {(summary['e2e_ms'] or {}).get('p50')} ms")
    stats = engine.stats()
    report = {"command": " ".join(["python", "bench/omni_engine_load.py", *(argv if argv is not None else sys.argv[1:])]),
              "date": now_iso(), "machine": machine(), "label": "omni", "engine": "omni built-in AR engine, in-process",
              "engine_config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()},
              "load_s": round(load_s, 1), "graphs_captured_at_start": captured, "capture_s": round(capture_s, 1),
              "warmup_s": round(warm_s, 1), "engine_stats": stats,
              "workload": {"prompts": "distinct random token ids", "prompt_len": args.prompt_len, "seed": args.seed,
                           "max_tokens": args.max_tokens, "ignore_eos": True, "sampling": "greedy"},
              "levels": summaries}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")
    if args.tokens_out:
        Path(args.tokens_out).write_text(json.dumps({"engine": "omni", "seed": args.seed, "prompt_len": args.prompt_len,
                                                     "max_tokens": args.max_tokens, "levels": records}) + "\n")
    return report


if __name__ == "__main__":
    main()
