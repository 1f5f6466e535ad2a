"""bench/serve.py's workload against SGLang's offline `Engine` in this process (SGLang alone, no HTTP).

Why not `sglang.launch_server`: on the H200 image its HTTP server does not import (jsonschema,
openai_harmony, zstandard and more are missing there and are not in the SGLang kit). The engine is
what the server wraps; driving it directly leaves out the HTTP/SSE hop that omnid's figures include,
so the comparison favours SGLang slightly.

Same work as serve.py: the same prompt set through the model's chat template (one user message),
`max_tokens` output tokens with `ignore_eos`, greedy, closed-loop clients per concurrency level,
warm-up requests first; rows and level summaries in serve.py's format (serve_report.level_summary).

Run:  python bench/sglang_engine_load.py --model-path DIR [--load-format dummy] [--concurrency 1,16,64]
          [--max-tokens 128] [--out sglang.json] [-- engine args as JSON: --engine-args '{...}']
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

from serve import PROMPT_SETS, closed_loop, sweep_levels  # noqa: E402
from serve_report import machine, now_iso, say  # noqa: E402


def chat_ids(tokenizer, prompt: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


async def one_request(engine, ids: list[int], max_tokens: int, i: int) -> dict[str, Any]:
    row: dict[str, Any] = {"index": i, "ok": False, "error": None, "ttft_s": None, "tpot_s": None, "ttfa_s": None,
                           "audio_s": None, "output_tokens": None, "latency_s": None}
    sampling = {"temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": True}
    t0 = time.perf_counter()
    first = last = None
    tokens = 0
    try:
        async for chunk in await engine.async_generate(input_ids=ids, sampling_params=sampling, stream=True):
            now = time.perf_counter()
            n = len(chunk.get("output_ids") or [])
            if n > tokens:
                first = first if first is not None else now
                last, tokens = now, n
    except Exception as exc:  # a failed request is a row, not a crash of the sweep
        row.update(error=f"{type(exc).__name__}: {exc}", latency_s=time.perf_counter() - t0)
        return row
    row.update(ok=True, latency_s=time.perf_counter() - t0, output_tokens=tokens,
               ttft_s=None if first is None else first - t0)
    if first is not None and tokens > 1:
        row["tpot_s"] = (last - first) / (tokens - 1)
    return row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--load-format", default="dummy")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-set", choices=sorted(PROMPT_SETS), default="short")
    ap.add_argument("--engine-args", default="{}", help="JSON of extra sglang.Engine arguments")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]

    import sglang
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    prompts = [chat_ids(tokenizer, p) for p in PROMPT_SETS[args.prompt_set]]
    engine_args = {"model_path": args.model_path, "load_format": args.load_format, "dtype": "bfloat16",
                   "attention_backend": "triton", "max_running_requests": max(levels),
                   "cuda_graph_max_bs_decode": max(levels), "mem_fraction_static": 0.7, "disable_radix_cache": True,
                   "context_length": 4096, "log_level": "warning", **json.loads(args.engine_args)}
    t0 = time.perf_counter()
    engine = sglang.Engine(**engine_args)
    start_s = time.perf_counter() - t0
    say(f"sglang.Engine up in {start_s:.1f}s")
    try:
        loop = asyncio.get_event_loop()
        def run(c: int, n: int, offset: int):
            return closed_loop(lambda i: one_request(engine, prompts[i % len(prompts)], args.max_tokens, i), c, n, offset)

        result = loop.run_until_complete(sweep_levels(run, levels, args.requests, args.warmup))
    finally:
        engine.shutdown()
    report = {"command": " ".join(["python", "bench/sglang_engine_load.py", *(argv or sys.argv[1:])]),
              "date": now_iso(), "machine": machine(), "label": "sglang", "engine_args": engine_args,
              "engine_start_s": round(start_s, 1), "server_note": "sglang.Engine in-process (no HTTP)",
              "workload": {"prompt_set": args.prompt_set, "max_tokens": args.max_tokens, "ignore_eos": True,
                           "modalities": ["text"]}, "levels": result}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
