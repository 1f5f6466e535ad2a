"""bench/serve.py's workload against SGLang's offline `Engine` in this process (SGLang alone, no HTTP).

Why not `sglang.launch_server`: on the H200 image its HTTP server does not import (jsonschema,
openai_harmony, zstandard and more are missing there and are not in the SGLang kit). The engine is
what the server wraps; driving it directly leaves out the HTTP/SSE hop that omnid's figures include,
so the comparison favours SGLang slightly.

Two workloads:
- default (the peer table of bench/sglang_peer.py): the prompt set through the model's chat template
  (one user message), `--load-format dummy`;
- `--prompt-len L` (the equal-work table, bench/equal_work.py): distinct random prompts of L token
  ids (equal_work_support.distinct_prompt: request i gets the same ids as in omni's driver), weights
  loaded from the checkpoint (`--load-format auto`), every level warmed once with 4-token requests,
  and with `--tokens-out` each request's output ids and token times (for bench/expert_hits.py).
Both: `max_tokens` output tokens with `ignore_eos`, greedy, closed-loop clients per concurrency
level, warm-up requests first; rows and level summaries in serve.py's format
(serve_report.level_summary).

Run:  python bench/sglang_engine_load.py --model-path DIR [--load-format dummy] [--concurrency 1,16,64]
          [--max-tokens 128] [--prompt-len 32 --seed 0 --tokens-out sglang_tokens.json] [--out sglang.json]
          [--engine-args '{...}' (JSON of extra sglang.Engine arguments)]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from equal_work_support import distinct_prompt  # noqa: E402
from serve import PROMPT_SETS, closed_loop, sweep_levels  # noqa: E402
from report import machine, now_iso, say  # noqa: E402


def chat_ids(tokenizer, prompt: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


async def one_request(engine, ids: list[int], max_tokens: int, i: int, record: dict | None = None,
                      t_level: float | None = None) -> dict[str, Any]:
    """Stream one request; with `record`, also its output ids and the time of every token (seconds
    from `t_level`). SGLang's streamed `output_ids` are cumulative (not incremental) by default."""
    row: dict[str, Any] = {"index": i, "ok": False, "error": None, "ttft_s": None, "tpot_s": None, "ttfa_s": None,
                           "audio_s": None, "output_tokens": None, "latency_s": None}
    sampling = {"temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": True}
    t0 = time.perf_counter()
    base = t_level if t_level is not None else t0
    first = last = None
    tokens = 0
    got: list[int] = []
    times: list[float] = []
    try:
        async for chunk in await engine.async_generate(input_ids=ids, sampling_params=sampling, stream=True):
            now = time.perf_counter()
            out = chunk.get("output_ids") or []
            n = len(out)
            if n > tokens:
                first = first if first is not None else now
                if record is not None:
                    got.extend(int(t) for t in out[tokens:n])
                    times.extend([now - base] * (n - tokens))
                last, tokens = now, n
    except Exception as exc:  # a failed request is a row, not a crash of the sweep
        row.update(error=f"{type(exc).__name__}: {exc}", latency_s=time.perf_counter() - t0)
        return row
    row.update(ok=True, latency_s=time.perf_counter() - t0, output_tokens=tokens,
               ttft_s=None if first is None else first - t0)
    if first is not None and tokens > 1:
        row["tpot_s"] = (last - first) / (tokens - 1)
    if record is not None:
        record.update(index=i, output_ids=got, t_submit=t0 - base, t_tokens=times)
    return row


async def equal_work_levels(engine, prompt, levels: list[int], requests: int | None, max_tokens: int,
                            warm: bool = True) -> tuple[list[dict], list[dict]]:
    """Every level warmed once (c requests of 4 tokens), then the levels: (summaries, token records)."""
    from serve_report import level_summary

    if warm:
        for k, c in enumerate(levels):
            say(f"warm-up: {c} x 4 tokens")
            await closed_loop(lambda i: one_request(engine, prompt(10**6 + 1000 * k + i), 4, i), c, c)
    summaries, records, offset = [], [], 0
    for c in levels:
        n = requests or max(2 * c, 8)
        recs: dict[int, dict] = {}
        t_level = time.perf_counter()

        async def one(i: int) -> dict:
            recs[i] = {}
            return await one_request(engine, prompt(i), max_tokens, i, recs[i], t_level)

        rows, wall = await closed_loop(one, c, n, offset)
        offset += n
        summary = {"phase": "warm", **level_summary(rows, wall, c)}
        say(f"c={c}: ok {summary['ok']}/{n} in {wall:.2f}s; tpot p50 {(summary['tpot_ms'] or {}).get('p50')} ms")
        summaries.append(summary)
        records.append({"phase": "warm", "concurrency": c,
                        "requests": [recs[i] for i in sorted(recs) if recs[i].get("output_ids") is not None]})
    return summaries, records


def engine_args(args, levels: list[int]) -> dict[str, Any]:
    return {"model_path": args.model_path, "load_format": args.load_format, "dtype": "bfloat16",
            "attention_backend": "triton", "max_running_requests": max(levels),
            "cuda_graph_max_bs_decode": max(levels), "mem_fraction_static": 0.7, "disable_radix_cache": True,
            "context_length": 4096, "log_level": "warning", **json.loads(args.engine_args)}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--load-format", default=None, help="default dummy; auto (the checkpoint) with --prompt-len")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=4, help="requests before the levels (prompt-set workload)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-set", choices=sorted(PROMPT_SETS), default="short")
    ap.add_argument("--prompt-len", type=int, default=0, help="> 0: distinct random prompts of this many ids")
    ap.add_argument("--seed", type=int, default=0, help="of the distinct prompts")
    ap.add_argument("--tokens-out", default=None, help="token streams and times (with --prompt-len)")
    ap.add_argument("--engine-args", default="{}", help="JSON of extra sglang.Engine arguments")
    ap.add_argument("--out", default=None)
    return ap


def main(argv: list[str] | None = None, engine_factory=None) -> dict:
    """`engine_factory(**engine_args)` builds the engine (default `sglang.Engine`; tests pass a stand-in)."""
    args = build_parser().parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    distinct = args.prompt_len > 0
    args.load_format = args.load_format or ("auto" if distinct else "dummy")
    if engine_factory is None:
        import sglang

        engine_factory = sglang.Engine
    if distinct:
        vocab = json.loads((Path(args.model_path) / "config.json").read_text())["vocab_size"]
        prompt = lambda i: distinct_prompt(i, args.prompt_len, args.seed, vocab)  # noqa: E731
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model_path)
        prompts = [chat_ids(tokenizer, p) for p in PROMPT_SETS[args.prompt_set]]
        prompt = lambda i: prompts[i % len(prompts)]  # noqa: E731
    eargs = engine_args(args, levels)
    t0 = time.perf_counter()
    engine = engine_factory(**eargs)
    start_s = time.perf_counter() - t0
    say(f"sglang.Engine up in {start_s:.1f}s")
    records: list[dict] = []
    try:
        loop = getattr(engine, "loop", None)  # sglang.Engine makes and sets its loop at init: use that one
        if loop is None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
        if distinct:
            result, records = loop.run_until_complete(
                equal_work_levels(engine, prompt, levels, args.requests, args.max_tokens))
        else:
            def run(c: int, n: int, offset: int):
                return closed_loop(lambda i: one_request(engine, prompt(i), args.max_tokens, i), c, n, offset)

            result = loop.run_until_complete(sweep_levels(run, levels, args.requests, args.warmup))
    finally:
        engine.shutdown()
    workload = ({"prompts": "distinct random token ids", "prompt_len": args.prompt_len, "seed": args.seed}
                if distinct else {"prompt_set": args.prompt_set})
    report = {"command": " ".join(["python", "bench/sglang_engine_load.py", *(argv if argv is not None else sys.argv[1:])]),
              "date": now_iso(), "machine": machine(), "label": "sglang", "engine_args": eargs,
              "engine_start_s": round(start_s, 1), "server_note": "sglang.Engine in-process (no HTTP)",
              "workload": {**workload, "max_tokens": args.max_tokens, "ignore_eos": True, "modalities": ["text"],
                           "sampling": "greedy"}, "levels": result}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if args.tokens_out and distinct:
        Path(args.tokens_out).write_text(json.dumps({"engine": "sglang", "seed": args.seed, "prompt_len": args.prompt_len,
                                                     "max_tokens": args.max_tokens, "levels": records}) + "\n")
    return report


if __name__ == "__main__":
    main()
