"""The code predictor's frame on the fused kernels against the unfused graph, full size, one GPU.

Random weights at the published sizes (5 layers, hidden 1024, 16 heads / 8 KV, 16 code groups),
every row sampling at the talker's default (top-k 50, top-p 0.8, seeded noise). Per batch size:
ms a frame for the unfused CUDA graph, the fused CUDA graph and the fused frame without a graph
(CUDA events over `--frames` replays, codes copied to the host each frame as the talker does);
codes: fused == unfused in float32 (must be exact) and the agreement in bf16 (kernels differ in
reduction order, so near-ties flip: informative only).

Run:  python bench/predictor_fused_gpu.py [--batch 1,16,64] [--frames 50] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import torch  # noqa: E402

from omni.models.qwen3_omni.checkpoint.presets_full import full_config  # noqa: E402
from omni.models.qwen3_omni.config import load_config  # noqa: E402
from omni.stages.codec_lm.code_predictor_graphs import CodePredictorGraphs  # noqa: E402
from talker_step_gpu import build_predictor  # noqa: E402


def _inputs(model, b: int, device: str):
    gen = torch.Generator(device=device).manual_seed(b)
    dtype = model.lm_head[0].weight.dtype
    hidden = torch.randn(b, model.spec.hidden_size, generator=gen, device=device).to(dtype)
    code0 = torch.randint(0, model.spec.vocab_size, (b,), generator=gen, device=device)
    embed = model.model.codec_embedding[0](code0)
    temperature = torch.full((b,), 0.9, device=device)
    return hidden, embed, temperature, torch.arange(b, device=device) + 7, torch.zeros(b, dtype=torch.long, device=device)


def _ms(fn, n: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,16,64")
    ap.add_argument("--frames", type=int, default=50)
    ap.add_argument("--out", default=None)
    ap.add_argument("--tiles", default=None,
                    help="settings to sweep, ';'-separated JSON: {'norm': {...}, 'plain': {...}} update "
                         "LINEAR_TILES' classes, 'radix' / 'warps' set SAMPLE_RADIX / SAMPLE_WARPS")
    a = ap.parse_args()
    batches = [int(b) for b in a.batch.split(",")]
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(full_config()))
        cfg = load_config(tmp)
    rows = []
    if a.tiles:
        from omni.layers import predictor_kernels
        import copy
        model = build_predictor(cfg, "cuda", torch.bfloat16)
        defaults = copy.deepcopy(predictor_kernels.LINEAR_TILES)
        for tiles in a.tiles.split(";"):
            for cls, values in defaults.items():
                predictor_kernels.LINEAR_TILES[cls].update(values)
            update = json.loads(tiles)
            predictor_kernels.SAMPLE_RADIX = update.pop("radix", True)
            predictor_kernels.SAMPLE_WARPS = update.pop("warps", 4)
            for cls, values in update.items():
                predictor_kernels.LINEAR_TILES[cls].update(values)
            g = CodePredictorGraphs(model, max(batches), "cuda", fused=True)
            g.capture_all()
            for b in batches:
                args = _inputs(model, b, "cuda")
                g.run(*args)
                row = {"tiles": tiles, "batch": b, "fused_graph_ms": round(_ms(lambda: g.run(*args)[0].cpu(), a.frames), 3)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        return
    for dtype in (torch.bfloat16, torch.float32):
        model = build_predictor(cfg, "cuda", dtype)
        plain = CodePredictorGraphs(model, max(batches), "cuda", fused=False)
        fused = CodePredictorGraphs(model, max(batches), "cuda", fused=True)
        eager_fused = CodePredictorGraphs(model, max(batches), "cuda", fused=True)
        eager_fused.capture = False
        t0 = time.perf_counter()
        fused.capture_all()
        capture_s = time.perf_counter() - t0
        plain.capture_all()
        for b in batches:
            args = _inputs(model, b, "cuda")
            for g in (plain, fused, eager_fused):
                for _ in range(3):
                    g.run(*args)[0].cpu()
            row = {"dtype": str(dtype).split(".")[-1], "batch": b, "fused_capture_all_s": round(capture_s, 2)}
            for name, g in (("graph_ms", plain), ("fused_graph_ms", fused), ("fused_eager_ms", eager_fused)):
                row[name] = round(_ms(lambda: g.run(*args)[0].cpu(), a.frames), 3)
            same = (plain.run(*args)[0] == fused.run(*args)[0]).float().mean().item()
            row["codes_equal_fraction"] = round(same, 4)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows, "gpu": torch.cuda.get_device_name()}, indent=1))


if __name__ == "__main__":
    main()
