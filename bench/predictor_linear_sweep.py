"""Launch shapes of the code predictor's fused linear kernel and sampler, swept on one GPU.

The frame's time is ~84 % `_linear_kernel` (profile, bench/RESULTS.md): each projection reads its
weight once, yet a call took ~17 us (~180 GB/s) where HBM allows ~2 us, so the question is the
launch shape, not the arithmetic. For every projection of the full-size code predictor (random bf16
weights, `build_predictor` at the published sizes) and rows M in --rows, this times each candidate
tiling (output columns per program BN, K per iteration BK, split-K SPLIT, warps, stages) as it runs
in the frame: inside a CUDA graph, `--calls` back-to-back calls over distinct weight copies (more
bytes than L2 holds, so weights come from HBM as they do in a frame). Then the sampler kernel with
its sort vs radix select. Prints one JSON row per measurement and the best tiling per shape.

Run:  python bench/predictor_linear_sweep.py [--rows 1,64] [--proj qkv,o,gate_up,down,head] [--out F.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import torch  # noqa: E402

from omni.layers import predictor_kernels as pk  # noqa: E402
from omni.layers.predictor_frame import FusedPredictorFrame  # noqa: E402
from omni.layers.rotary import rope_cos_sin  # noqa: E402
from omni.models.qwen3_omni.checkpoint.presets_full import full_config  # noqa: E402
from omni.models.qwen3_omni.config import load_config  # noqa: E402
from talker_step_gpu import build_predictor  # noqa: E402

L2_BYTES = 60 << 20  # more than the H200's 50 MB L2


def _graph_us(call, calls: int, replays: int = 20) -> float:
    """us per call of `call(i)` for i < calls, recorded in one CUDA graph and replayed."""
    for i in range(calls):  # compile + warm
        call(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * calls)


def projections(frame: FusedPredictorFrame) -> list[dict]:
    """The frame's linear calls: name, weight, prologue/epilogue flags."""
    p = frame.layers[0]
    return [
        {"name": "qkv", "w": p["qkv"], "norm": True, "bias": p["qkv_bias"] is not None},
        {"name": "o", "w": p["o"], "resid": True},
        {"name": "gate_up", "w": p["gate_up"], "norm": True, "glu": True},
        {"name": "down", "w": p["down"], "resid": True},
        {"name": "head", "w": frame.heads[0], "norm": True},
    ]


def sweep_linear(proj: dict, m: int, candidates: list[dict], counters) -> list[dict]:
    w0 = proj["w"]
    n, k = w0.shape
    copies = max(2, L2_BYTES // (w0.numel() * w0.element_size()) + 1)
    weights = [torch.randn_like(w0) * 0.02 for _ in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=w0.dtype)
    nw = torch.ones(k, device="cuda", dtype=w0.dtype) if proj.get("norm") else None
    bias = torch.zeros(n, device="cuda", dtype=w0.dtype) if proj.get("bias") else None
    resid = torch.randn(m, n, device="cuda", dtype=w0.dtype) if proj.get("resid") else None
    outs = [torch.empty(m, n // 2 if proj.get("glu") else n, device="cuda", dtype=w0.dtype) for _ in range(copies)]
    ref = None
    rows = []
    tiles = pk.LINEAR_TILES["norm" if proj.get("norm") else "plain"]
    base = dict(tiles)
    for cand in candidates:
        tiles.update(base, **cand)
        call = lambda i: pk.linear(x, weights[i], norm_weight=nw, bias=bias, residual=resid,  # noqa: E731
                                   glu=proj.get("glu", False), out=outs[i], counters=counters)
        try:
            us = _graph_us(call, copies)
        except Exception as exc:  # a tiling that does not compile or fit
            rows.append({"proj": proj["name"], "m": m, **cand, "error": f"{type(exc).__name__}: {exc}"[:200]})
            continue
        got = outs[0].float()
        ref = got if ref is None else ref
        tiling = pk.linear_tiling(m, n, k, bool(proj.get("norm")), x.element_size())
        gbs = w0.numel() * w0.element_size() / us / 1e3
        rows.append({"proj": proj["name"], "m": m, "n": n, "k": k, **cand, "split": tiling["SPLIT"],
                     "us": round(us, 2), "GB/s": round(gbs), "max_diff": round((got - ref).abs().max().item(), 4)})
        print(json.dumps(rows[-1]), flush=True)
    tiles.update(base)
    return rows


def sweep_sample(frame: FusedPredictorFrame, m: int) -> list[dict]:
    table = frame.tables[0]
    vocab, width = table.shape
    logits = torch.randn(m, vocab, device="cuda", dtype=table.dtype) * 3
    temp = torch.full((m,), 0.9, device="cuda")
    seed, fr = torch.arange(m, device="cuda") + 3, torch.zeros(m, dtype=torch.long, device="cuda")
    codes = torch.zeros(m, dtype=torch.long, device="cuda")
    embeds = torch.zeros(m, width, device="cuda", dtype=table.dtype)
    rows, got = [], {}
    for radix, warps in ((False, 4), (True, 1), (True, 2), (True, 4), (True, 8)):
        pk.SAMPLE_RADIX, pk.SAMPLE_WARPS = radix, warps
        call = lambda i: pk.sample_embed(logits, temp, seed, fr, table, codes, embeds, top_k=frame.top_k,  # noqa: E731
                                         top_p=frame.top_p, group=i % 15, groups_per_frame=15)
        us = _graph_us(call, 15)
        got[radix] = codes.clone()
        rows.append({"kernel": "sample_embed", "m": m, "radix": radix, "warps": warps, "us": round(us, 2)})
        print(json.dumps(rows[-1]), flush=True)
    rows[-1]["same_codes_as_sort"] = bool(torch.equal(got[False], got[True]))
    pk.SAMPLE_RADIX, pk.SAMPLE_WARPS = True, 4
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,64")
    ap.add_argument("--proj", default="qkv,o,gate_up,down,head", help="which projections to sweep")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(full_config()))
        cfg = load_config(tmp)
    model = build_predictor(cfg, "cuda", torch.bfloat16)
    cos, sin = rope_cos_sin(model.inv_freq.cuda(), torch.arange(model.num_code_groups, device="cuda"), torch.bfloat16)
    frame = FusedPredictorFrame(model, cos, sin, 50, 0.8)
    shapes = [{"bn": bn, "bn_large": bn, "bk": bk, "split": split}
              for bn, bk, split in itertools.product((16, 32, 64), (128, 256), (1, 4, 8))]
    rows, best = [], {}
    for m in [int(v) for v in a.rows.split(",")]:
        for proj in (p for p in projections(frame) if p["name"] in a.proj.split(",")):
            got = sweep_linear(proj, m, shapes, frame.counters)
            ok = sorted((r for r in got if "us" in r), key=lambda r: r["us"])
            top = ok[:3]
            extra = [dict({k: r[k] for k in ("bn", "bn_large", "bk", "split")}, warps=w, stages=s, stages_many=s)
                     for r in top[:2] for w, s in ((2, 3), (8, 3), (4, 4), (8, 4))]
            got += sweep_linear(proj, m, extra, frame.counters)
            ok = sorted((r for r in got if "us" in r), key=lambda r: r["us"])
            best[f"{proj['name']}@{m}"] = ok[0]
            rows += got
        rows += sweep_sample(frame, m)
    print("best per shape:")
    for key, row in best.items():
        print(f"  {key:12s} {row['us']:7.2f} us {row['GB/s']:5d} GB/s  bn={row['bn']} bk={row['bk']} "
              f"split={row['split']} warps={row.get('warps', 4)} stages={row.get('stages', 3)}")
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows, "best": best}, indent=1))


if __name__ == "__main__":
    main()
