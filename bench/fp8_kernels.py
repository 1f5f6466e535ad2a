"""FP8 kernels vs their bf16 counterparts on one GPU (issue 28), at the thinker's real shapes: the
block-scaled FP8 GEMM (`fp8_gemm`) vs `F.linear` in bf16 (cuBLAS) for q/k/v/o projections, and the
fused FP8 MoE (`moe_fp8`) vs the bf16 Triton MoE (`moe_triton`), at M tokens = 1, 16, 64, 512.
Each is timed by CUDA events over `--iters` launches after warm-up (weights stay L2-cold only when
larger than L2: the experts and q/o projections are). `--sweep`: every dense config of a small grid
too (block_m, block_n, num_stages), to pick the table's entries.

Run:  python bench/fp8_kernels.py --out OUT.json [--rows 1,16,64,512] [--iters 50] [--sweep]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from omni.layers.fp8 import quantize_blocks  # noqa: E402
from omni.layers import fp8_cublas  # noqa: E402
from omni.layers.fp8_gemm import GemmConfig, block_fp8_matmul  # noqa: E402
from omni.layers.fp8_modules import quantize_experts  # noqa: E402
from omni.layers.moe_fp8 import fused_fp8_experts  # noqa: E402
from omni.layers.moe_triton import fused_routed_experts  # noqa: E402
from report import machine, now_iso, say  # noqa: E402

DENSE = {"q_proj": (4096, 2048), "kv_proj": (512, 2048), "o_proj": (2048, 4096)}
EXPERTS, TOP_K, HIDDEN, INNER = 128, 8, 2048, 768


def timed(fn, iters: int) -> float:
    """Microseconds per call (CUDA events, after 3 warm-up calls)."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return round(1000 * start.elapsed_time(end) / iters, 2)


def dense_rows(rows: list[int], iters: int, sweep: bool) -> list[dict]:
    out = []
    for name, (n, k) in DENSE.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        q, s = quantize_blocks(w)
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            row = {"op": name, "rows": m, "bf16_us": timed(lambda: F.linear(x, w), iters),
                   "fp8_us": timed(lambda: block_fp8_matmul(x, q, s), iters)}
            row["ratio"] = round(row["fp8_us"] / row["bf16_us"], 3)
            if fp8_cublas.usable(x.device):  # cuBLAS block-scaled FP8 (what fp8_linear takes where usable)
                try:
                    row["cublas_fp8_us"] = timed(lambda: fp8_cublas.cublas_fp8_linear(x, q, s), iters)
                    row["cublas_ratio"] = round(row["cublas_fp8_us"] / row["bf16_us"], 3)
                except RuntimeError as exc:  # a shape cuBLAS refuses: reported, the others still timed
                    row["cublas_fp8"] = str(exc).splitlines()[0][:160]
            else:
                row["cublas_fp8"] = fp8_cublas._probed.get(x.device.index or 0)
            if sweep:
                grid = {}
                for bm in (16, 32, 64):
                    for bn in (16, 32, 64, 128):
                        for stages in (3, 4, 6):
                            cfg = GemmConfig(bm, bn, 4, stages)
                            try:
                                grid[f"{bm}x{bn}s{stages}"] = timed(lambda: block_fp8_matmul(x, q, s, config=cfg), iters)
                            except Exception as exc:  # out of shared memory and the like
                                grid[f"{bm}x{bn}s{stages}"] = f"{type(exc).__name__}"
                best = min((v, k) for k, v in grid.items() if isinstance(v, float))
                row["sweep_best"], row["sweep"] = {"config": best[1], "us": best[0]}, grid
            say(json.dumps({k: v for k, v in row.items() if k != "sweep"}))
            out.append(row)
    return out


def moe_rows(rows: list[int], iters: int) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate_up = torch.randn(EXPERTS, 2 * INNER, HIDDEN, generator=gen, device="cuda", dtype=torch.bfloat16) / HIDDEN**0.5
    down = torch.randn(EXPERTS, HIDDEN, INNER, generator=gen, device="cuda", dtype=torch.bfloat16) / INNER**0.5
    (gq, gs), (dq, ds) = quantize_experts(gate_up, "gate_up_proj"), quantize_experts(down, "down_proj")
    out = []
    for m in rows:
        x = torch.randn(m, HIDDEN, generator=gen, device="cuda", dtype=torch.bfloat16)
        probs = torch.randn(m, EXPERTS, generator=gen, device="cuda").softmax(-1)
        weights, chosen = probs.topk(TOP_K, dim=-1)
        weights = weights.to(torch.bfloat16)
        row = {"op": "moe", "rows": m,
               "bf16_us": timed(lambda: fused_routed_experts(x, weights, chosen, gate_up, down), iters),
               "fp8_us": timed(lambda: fused_fp8_experts(x, weights, chosen, gq, gs, dq, ds), iters)}
        row["ratio"] = round(row["fp8_us"] / row["bf16_us"], 3)
        say(json.dumps(row))
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,16,64,512")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    report = {"command": " ".join(["python", "bench/fp8_kernels.py", *(argv if argv is not None else sys.argv[1:])]),
              "date": now_iso(), "machine": machine(), "gpu": torch.cuda.get_device_name()}
    report["moe"] = moe_rows(rows, args.iters)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    report["dense"] = dense_rows(rows, args.iters, args.sweep)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
