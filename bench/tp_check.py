"""Tensor-parallel thinker vs the unsplit one on GPUs: same greedy tokens, and decode speed.

The built-in engine runs a tiny Qwen3-Omni thinker (float32: exact comparison) unsplit on the first
device and split over `--devices` (omni/stages/ar/tensor_parallel.py): NCCL when the devices are
distinct GPUs, gloo when they repeat one (two ranks on one GPU: NCCL refuses that, so the split's
CUDA path is checked on a single H200 through gloo). The engines use the GPU paths serving uses
(Triton decode attention, fused ops, the routed-experts kernels); CUDA graphs are off at TP > 1, so
both sides run eagerly. Then the same for a deeper preset, in float32 and in bfloat16, where the split's partial sums
round differently: its token agreement is reported, not asserted.

Run:  python bench/tp_check.py --devices cuda:0,cuda:0 --out OUT.json     (one GPU)
      python bench/tp_check.py --devices cuda:0,cuda:1 --out OUT.json     (two GPUs, NCCL)
      python bench/tp_check.py --devices cpu,cpu --out OUT.json --max-tokens 4 --requests 2   (CPU dry run)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny  # noqa: E402
from omni.layers.tokenizer_offline import token_ids  # noqa: E402
from omni.models.qwen3_omni.modules.thinker import Qwen3OmniThinker  # noqa: E402
from omni.stages.ar.config import EngineConfig  # noqa: E402
from omni.stages.ar.engine import AREngine  # noqa: E402
from omni.stages.ar.sequence import SamplingParams  # noqa: E402
from omni.stages.ar.tensor_parallel import CacheRecipe, ShardRecipe, TensorParallelModel, backend_for  # noqa: E402


def prompts(vocab: int, n: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    special = min(token_ids().values())  # the offline tokenizer's byte ids come first: no media placeholders
    return [torch.randint(0, min(vocab, special), (length + 3 * i,), generator=g).tolist() for i in range(n)]


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run(engine: AREngine, batch: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    engine.generate(batch[:1], params)  # warm (Triton compiles)
    sync()
    t0 = time.perf_counter()
    out = engine.generate(batch, params)
    sync()
    return out, time.perf_counter() - t0


def check(ckpt: Path, devices: list[str], dtype: str, max_tokens: int, n: int) -> dict:
    config = EngineConfig(block_size=16, num_blocks=256, max_num_seqs=max(n, 1), max_model_len=1024,
                          device=devices[0],
                          attention_backend="triton" if devices[0].startswith("cuda") else "torch")
    base = Qwen3OmniThinker.from_checkpoint(ckpt, device=devices[0], dtype=getattr(torch, dtype))
    batch = prompts(base.cfg.text.vocab_size, n, 40, seed=1)
    one = AREngine(base, config)
    want, t_one = run(one, batch, max_tokens)
    del one, base
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    recipe = ShardRecipe("omni.models.qwen3_omni.modules.thinker_tp:build_shard", {"model_dir": str(ckpt), "dtype": dtype})
    model = TensorParallelModel.launch(recipe, len(devices), devices,
                                       CacheRecipe(config.num_blocks, config.block_size, "", config.attention_backend))
    try:
        two = AREngine(model, config)
        got, t_two = run(two, batch, max_tokens)
    finally:
        model.shutdown()
    same = sum(a == b for a, b in zip(want, got))
    first_diff = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(want, got)]
    tokens = n * max_tokens
    return {"checkpoint": ckpt.name, "dtype": dtype, "devices": devices, "backend": backend_for(devices),
            "requests": n, "max_tokens": max_tokens, "identical_requests": same, "first_difference_at": first_diff,
            "tp1_tokens_per_s": round(tokens / t_one, 1), f"tp{len(devices)}_tokens_per_s": round(tokens / t_two, 1)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", default="cuda:0,cuda:0")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=8)
    a = ap.parse_args()
    devices = a.devices.split(",")
    root = Path(tempfile.mkdtemp(prefix="tp-check-"))
    results = []
    for preset, dtype, strict in (("tiny-a", "float32", True), ("tiny-c", "float32", True), ("tiny-c", "bfloat16", False)):
        ckpt = root / preset
        if not ckpt.exists():
            make_tiny(ckpt, seed=7, preset=preset)
        try:
            res = check(ckpt, devices, dtype, a.max_tokens, a.requests)
        except Exception as exc:  # the report says what failed; the exit code says it failed
            res = {"checkpoint": preset, "dtype": dtype, "error": f"{type(exc).__name__}: {exc}"}
        res["asserted"] = strict
        res["ok"] = "error" not in res and (not strict or res["identical_requests"] == res["requests"])
        results.append(res)
        print(json.dumps(res), flush=True)
    Path(a.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "results": results}, indent=2) + "\n")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
