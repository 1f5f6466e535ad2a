"""The thinker's small per-layer ops, fused (Triton, `fused_ops`) vs unfused (torch), at full shapes.

Per op and batch size: kernels launched per call (torch profiler), GPU time per call with the
call replayed `--reps` times from one CUDA graph (launch gaps gone: what a decode step pays
inside its graph), and eager wall time per call (what prefill and a graph-less step pay).
Ops: input RMSNorm (hidden 2048), residual add + post-attention RMSNorm, q/k RMSNorm + RoPE
(32 + 4 heads of 128), router softmax/top-8 of 128/renormalise (the router GEMM is shared, left
out). The last rows sum one layer's ops and scale by 48 layers. JSON to --out, markdown on stdout.

Run (H200, < 40 s): PYTHONPATH=$PWD python3 bench/fused_ops_gpu.py --out fused_ops.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from omni.layers import fused_ops
from omni.layers.norms import RMSNorm
from omni.layers.rotary import apply_rope, rope_inv_freq
from omni.layers.rotary import mrope_cos_sin

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, TOP_K, LAYERS, EPS = 2048, 32, 4, 128, 128, 8, 48, 1e-6


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", default="1,16")
    p.add_argument("--reps", type=int, default=50, help="calls captured in one graph")
    p.add_argument("--iters", type=int, default=20, help="graph replays timed")
    p.add_argument("--out", default="")
    return p.parse_args()


def _unfused_route(logits: torch.Tensor):
    """The SparseMoE.route maths after the router GEMM (the torch path)."""
    weights, chosen = torch.topk(logits.softmax(-1, dtype=torch.float), TOP_K, dim=-1)
    return (weights / weights.sum(-1, keepdim=True)).to(logits.dtype), chosen


def _ops(tokens: int):
    """name -> (unfused fn, fused fn), each on fixed bf16 inputs at full thinker shapes."""
    dev, bf = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(tokens)

    def rand(*shape):
        return torch.randn(*shape, generator=g, device=dev).to(bf)

    norm, qn, kn = (RMSNorm(d, EPS).to(dev, bf) for d in (HIDDEN, HEAD_DIM, HEAD_DIM))
    x, res, logits = rand(tokens, HIDDEN), rand(tokens, HIDDEN), rand(tokens, EXPERTS)
    q, k = rand(tokens, HEADS, HEAD_DIM), rand(tokens, KV_HEADS, HEAD_DIM)
    positions = torch.arange(tokens, device=dev).float()
    cos, sin = mrope_cos_sin(rope_inv_freq(HEAD_DIM, 1e6), positions, (24, 20, 20), bf)

    def plain_norm(h):
        f = h.float()
        return norm.weight * (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + EPS)).to(bf)

    def plain_head_norm(h, w):
        f = h.float()
        return w * (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + EPS)).to(bf)

    def plain_add_norm():
        summed = res + x
        return plain_norm(summed), summed

    return {
        "rms_norm": (lambda: plain_norm(x), lambda: fused_ops.rms_norm(x, norm.weight, EPS)),
        "add_rms_norm": (plain_add_norm, lambda: fused_ops.rms_norm(x, norm.weight, EPS, residual=res)),
        "qk_norm_rope": (
            lambda: (apply_rope(plain_head_norm(q, qn.weight), cos, sin), apply_rope(plain_head_norm(k, kn.weight), cos, sin)),
            lambda: fused_ops.qk_norm_rope(q, k, qn.weight, kn.weight, EPS, cos, sin)),
        "route_topk": (lambda: _unfused_route(logits), lambda: fused_ops.route_topk(logits, TOP_K, True, bf)),
    }


def _kernels(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def _graph_us(fn, reps: int, iters: int) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (iters * reps)


def _eager_us(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / iters


def main() -> None:
    a = _args()
    fused_ops.use_fused_ops(True)
    rows = []
    for tokens in (int(t) for t in a.tokens.split(",")):
        total = {"unfused": [0, 0.0, 0.0], "fused": [0, 0.0, 0.0]}
        for name, fns in _ops(tokens).items():
            for kind, fn in zip(("unfused", "fused"), fns):
                row = {"tokens": tokens, "op": name, "path": kind, "kernels": _kernels(fn),
                       "graph_us": _graph_us(fn, a.reps, a.iters), "eager_us": _eager_us(fn, 200)}
                rows.append(row)
                for i, key in enumerate(("kernels", "graph_us", "eager_us")):  # each op once per layer
                    total[kind][i] += row[key]
        for kind, (kern, g_us, e_us) in total.items():
            rows.append({"tokens": tokens, "op": f"per layer x{LAYERS}", "path": kind, "kernels": kern * LAYERS,
                         "graph_us": g_us * LAYERS, "eager_us": e_us * LAYERS})
    print("| T | op | path | kernels | GPU us (graph) | eager us |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tokens']} | {r['op']} | {r['path']} | {r['kernels']} | {r['graph_us']:.1f} | {r['eager_us']:.1f} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
