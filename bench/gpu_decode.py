"""Thinker decode speed of the full-size Qwen3-Omni-30B-A3B (random bf16 weights) on one GPU.

The thinker runs on omni's AR engine, built by `random_load` (meta device, weights drawn on the
GPU: no checkpoint). For each mode (eager; CUDA graphs; CUDA graphs + Triton paged decode) and
batch size, B requests are prefilled, a few decode steps warm up (graph capture happens
there), then `--tokens` engine steps are timed: TPOT = wall time per step (sampling and the
engine's Python included), tok/s = B / TPOT. The HBM roofline at batch 1 is the active weight
bytes per token (`thinker_active_bytes`: 6.08 GB) over the HBM bandwidth (`--hbm-tbps`, 4.8
for an H200).

Run:  python bench/gpu_decode.py [--batch 1,16] [--tokens 64] [--modes eager,graphs,graphs+triton]
          [--scaled] [--no-fused-ops] [--out bench/results/gpu_decode.json] [--md bench/gpu_decode.md]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import torch  # noqa: E402

from omni.models.qwen3_omni.config import load_config  # noqa: E402
from omni.models.qwen3_omni.checkpoint.presets_full import full_config, scaled_config, thinker_active_bytes  # noqa: E402
from omni.models.qwen3_omni.checkpoint.random_load import random_thinker  # noqa: E402
from omni.stages.ar.config import EngineConfig  # noqa: E402
from omni.stages.ar.engine import AREngine  # noqa: E402
from omni.stages.ar.sequence import SamplingParams  # noqa: E402
from report import machine, now_iso, say  # noqa: E402

MODES = {"eager": {}, "graphs": {"cuda_graphs": True},
         "graphs+triton": {"cuda_graphs": True, "attention_backend": "triton"}}


def thinker_config(scaled: bool, tmp: Path):
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(scaled_config() if scaled else full_config()))
    return load_config(tmp).thinker


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_decode(model, batch: int, prompt_len: int, tokens: int, warmup: int, engine_args: dict,
                device: str = "cuda") -> dict:
    blocks_per_seq = -(-(prompt_len + tokens + warmup + 16) // 16)
    cfg = EngineConfig(block_size=16, num_blocks=batch * blocks_per_seq + 8, max_num_seqs=max(batch, 1),
                       max_model_len=blocks_per_seq * 16, max_num_batched_tokens=max(2048, batch * prompt_len),
                       device=device, cuda_graph_max_batch=max(batch, 1), **engine_args)
    engine = AREngine(model, cfg)
    gen = torch.Generator().manual_seed(batch)
    vocab = model.cfg.text.vocab_size
    for i in range(batch):
        prompt = torch.randint(0, 150000 if vocab > 150000 else vocab, (prompt_len,), generator=gen).tolist()
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=tokens + warmup + 4,
                                                           ignore_eos=True))
    steps = 0
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.seqs.values()):
        engine.step()  # prefill
        steps += 1
    for _ in range(warmup):
        engine.step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(tokens):
        engine.step()
    sync(device)
    wall = time.perf_counter() - t0
    stats = engine.stats()
    del engine
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    tpot = wall / tokens
    return {"batch": batch, "tpot_ms": round(1000 * tpot, 3), "tok_per_s": round(batch / tpot, 1),
            "graphs": stats.get("graphs"), "graph_steps": stats.get("decode_graph_steps"),
            "graphs_disabled": stats.get("graphs_disabled")}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--modes", default="eager,graphs,graphs+triton")
    ap.add_argument("--scaled", action="store_true", help="test sizes (for a dry run)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--hbm-tbps", type=float, default=4.8)
    ap.add_argument("--out", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--no-fused-ops", action="store_true", help="plain torch norms / rope / router (a stage's fused_ops=false)")
    args = ap.parse_args(argv)
    if args.no_fused_ops:
        from omni.layers.fused_ops import use_fused_ops

        use_fused_ops(False)
    cfg = thinker_config(args.scaled, Path("/tmp/omni-gpu-decode"))
    t0 = time.perf_counter()
    model = random_thinker(cfg, args.device, torch.bfloat16, seed=0)
    sync(args.device)
    load_s = time.perf_counter() - t0
    active = thinker_active_bytes(cfg)
    roofline = args.hbm_tbps * 1e12 / active
    say(f"thinker: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B params, random bf16 on "
        f"{torch.cuda.get_device_name() if args.device.startswith('cuda') else args.device} in {load_s:.1f}s; roofline at batch 1 {roofline:.0f} tok/s")
    rows = []
    for mode in args.modes.split(","):
        for b in (int(x) for x in args.batch.split(",")):
            try:
                row = {"mode": mode, **time_decode(model, b, args.prompt_len, args.tokens, args.warmup, MODES[mode], args.device)}
            except Exception as exc:  # report and go on: one broken mode must not hide the others
                row = {"mode": mode, "batch": b, "error": f"{type(exc).__name__}: {exc}"[:300]}
            if b == 1 and "tok_per_s" in row:
                row["roofline_fraction"] = round(row["tok_per_s"] / roofline, 3)
            say(json.dumps(row))
            rows.append(row)
    report = {"command": " ".join(["python", "bench/gpu_decode.py", *(argv if argv is not None else sys.argv[1:])]),
              "date": now_iso(), "machine": machine(), "load_s": round(load_s, 2),
              "active_bytes_per_token": active, "hbm_tbps": args.hbm_tbps, "roofline_tok_per_s": round(roofline, 1),
              "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if args.device.startswith("cuda")
              else None, "rows": rows}
    lines = ["| mode | batch | TPOT ms | tok/s | of roofline (b=1) | graphs |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['batch']} | {r.get('tpot_ms', r.get('error', '?'))} | {r.get('tok_per_s', '–')} "
                     f"| {r.get('roofline_fraction', '–')} | {r.get('graphs', '–')} |")
    table = "\n".join(lines)
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}))
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if args.md:
        Path(args.md).write_text(table + "\n")
    return report


if __name__ == "__main__":
    main()
