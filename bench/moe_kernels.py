"""One routed-expert MoE layer per backend (triton, grouped, bmm) at full thinker shapes.

Random bf16 weights for all experts, `--layers` distinct copies run back to back in one CUDA
graph (so a replay streams each layer's weights from HBM, not L2), replayed `--iters` times
between CUDA events. Reported per layer: time, and the weight bytes the routing needs
(distinct experts hit x bytes per expert) over that time, against the HBM peak. With
`--sweep`, the Triton path is also timed with a few other tile configs (the fixed table in
`moe_triton.CONFIGS` is what runs by default). JSON to --out, a markdown table on stdout.

Run (H200): PYTHONPATH=$PWD python3 bench/moe_kernels.py --out moe.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from omni.layers import moe_triton
from omni.layers.moe_routed import routed_experts
from omni.layers.moe_triton import MoeConfig

SWEEP = (MoeConfig(16, 32, 128, 64, 128), MoeConfig(16, 64, 128, 128, 128, num_stages=3),
         MoeConfig(16, 32, 256, 32, 256, num_stages=3), MoeConfig(16, 64, 64, 64, 64, num_stages=5),
         MoeConfig(32, 64, 64, 64, 64))


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", default="1,4,16,64,256")
    p.add_argument("--backends", default="triton,grouped,bmm")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inner", type=int, default=768)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--layers", type=int, default=4, help="distinct weight copies per replay (defeats L2)")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--bmm-max-pairs", type=int, default=128, help="bmm gathers one expert copy per pair")
    p.add_argument("--sweep", default="1,64", help="token counts for the Triton config sweep ('' = none)")
    p.add_argument("--sweep-budget-s", type=float, default=50.0, help="no new sweep configs after this")
    p.add_argument("--peak-gbs", type=float, default=4800.0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default="")
    return p.parse_args()


def _routing(tokens: int, a: argparse.Namespace, gen: torch.Generator):
    probs = torch.randn(tokens, a.experts, generator=gen).softmax(-1)
    weights, chosen = probs.topk(a.top_k, dim=-1)
    return (weights / weights.sum(-1, keepdim=True)).to(torch.bfloat16), chosen


def _time(step, device: str, iters: int) -> float:
    """Seconds per call of `step`: CUDA-graph replays between events (eager on CPU)."""
    if device == "cpu":
        step()
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        return (time.perf_counter() - t0) / iters
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compiles and allocates outside the capture
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    del graph
    return start.elapsed_time(end) / 1e3 / iters


def main() -> None:
    a = _args()
    t_start = time.perf_counter()
    dev = a.device
    gen = torch.Generator().manual_seed(0)
    dgen = torch.Generator(device=dev).manual_seed(0)
    expert_bytes = 3 * a.inner * a.hidden * 2
    layers = [(torch.randn(a.experts, 2 * a.inner, a.hidden, device=dev, generator=dgen, dtype=torch.bfloat16) * a.hidden**-0.5,
               torch.randn(a.experts, a.hidden, a.inner, device=dev, generator=dgen, dtype=torch.bfloat16) * a.inner**-0.5)
              for _ in range(a.layers)]
    rows, notes = [], []

    def run(tokens, backend, x, w, c, config=None):
        def step():
            outs = []
            for gu, dn in layers:
                if config is None:
                    outs.append(routed_experts(x, w, c, gu, dn, F.silu, backend=backend))
                else:
                    outs.append(moe_triton.fused_routed_experts(x, w, c, gu, dn, config=config))
            return outs
        return _time(step, dev, a.iters) / a.layers, step()[0]

    for tokens in [int(t) for t in a.tokens.split(",") if t]:
        weights, chosen = _routing(tokens, a, gen)
        distinct = int(chosen.unique().numel())
        need = distinct * expert_bytes
        x = torch.randn(tokens, a.hidden, generator=gen).to(dev, torch.bfloat16)
        w, c = weights.to(dev), chosen.to(dev)
        base = None
        for backend in a.backends.split(","):
            row = dict(tokens=tokens, pairs=tokens * a.top_k, distinct_experts=distinct, need_mb=round(need / 1e6, 1),
                       backend=backend)
            if backend == "bmm" and tokens * a.top_k > a.bmm_max_pairs:
                rows.append(dict(row, skipped=f"bmm gathers {tokens * a.top_k} expert copies "
                                                f"({tokens * a.top_k * expert_bytes / 1e9:.1f} GB) per layer"))
                continue
            try:
                sec, out = run(tokens, backend, x, w, c)
            except Exception as exc:  # report and go on: one backend must not hide the others
                rows.append(dict(row, skipped=f"{type(exc).__name__}: {exc}"[:200]))
                continue
            base = out if base is None else base
            rows.append(dict(row, us=round(sec * 1e6, 1), gbs=round(need / sec / 1e9, 1),
                             of_peak=round(need / sec / 1e9 / a.peak_gbs, 3),
                             max_diff_vs_first=round((out.float() - base.float()).abs().max().item(), 5)))
        torch.cuda.empty_cache() if dev == "cuda" else None

    sweep = []
    for tokens in [int(t) for t in a.sweep.split(",") if t]:
        weights, chosen = _routing(tokens, a, gen)
        distinct = int(chosen.unique().numel())
        x = torch.randn(tokens, a.hidden, generator=gen).to(dev, torch.bfloat16)
        for cfg in SWEEP:
            if time.perf_counter() - t_start > a.sweep_budget_s:
                notes.append(f"sweep stopped at {a.sweep_budget_s} s")
                break
            sec, _ = run(tokens, "triton", x, weights.to(dev), chosen.to(dev), config=cfg)
            sweep.append(dict(tokens=tokens, config=cfg.__dict__, us=round(sec * 1e6, 1),
                              gbs=round(distinct * expert_bytes / sec / 1e9, 1)))

    total = time.perf_counter() - t_start
    device_name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    result = dict(device=device_name, torch=torch.__version__, shapes=dict(hidden=a.hidden, inner=a.inner, experts=a.experts,
                  top_k=a.top_k, layers=a.layers), default_configs=[(m, c.__dict__) for m, c in moe_triton.CONFIGS],
                  rows=rows, sweep=sweep, notes=notes, seconds=round(total, 1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    print(f"MoE layer, {device_name}: H={a.hidden} I={a.inner} E={a.experts} top-{a.top_k}, "
          f"{a.layers} weight copies per replay, peak {a.peak_gbs:.0f} GB/s\n")
    print("| T | pairs | experts hit | MB needed | backend | us/layer | GB/s | of peak | max diff vs first |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['tokens']} | {r['pairs']} | {r['distinct_experts']} | {r['need_mb']} | {r['backend']} | "
                  f"skipped: {r['skipped']} | | | |")
        else:
            print(f"| {r['tokens']} | {r['pairs']} | {r['distinct_experts']} | {r['need_mb']} | {r['backend']} | "
                  f"{r['us']} | {r['gbs']} | {100 * r['of_peak']:.1f} % | {r['max_diff_vs_first']} |")
    if sweep:
        print("\nTriton config sweep (block_m, block_n, block_k, down_block_n, down_block_k, warps, stages):\n")
        print("| T | config | us/layer | GB/s |\n|---|---|---|---|")
        for s in sweep:
            print(f"| {s['tokens']} | {tuple(s['config'].values())} | {s['us']} | {s['gbs']} |")
    print(f"\n{' '.join(notes)} total {total:.1f} s")


if __name__ == "__main__":
    main()
