"""FP8 vs bf16 thinker on one GPU (issue 28): weights memory, decode time per token, and the
teacher-forced top-1 agreement of an FP8 thinker with its dequantized bf16 twin.

The full-size Qwen3-Omni-30B-A3B thinker with random bf16 weights (`random_thinker`, drawn on the
GPU, seed 0) is timed first; then quantized in place (`fp8_modules.quantize_`: e4m3 + 128x128 block
scales for every attention projection and expert, as `--quantization fp8` does) and timed again.
Decode: omni's AR engine with CUDA graphs and the Triton paged decode (gpu_decode.time_decode: B
requests prefilled, warm-up steps, then `--tokens` timed steps; ms per step = ms per token of each
stream). Agreement: a second random bf16 thinker of the same seed gets the FP8 model's weights
dequantized (the "dequantized bf16" model: same weights, bf16 matmuls, bf16 activations); both
read the same `--positions` random tokens as one prompt and the argmax of their logits at every
position are compared (teacher forcing: each position sees the true prefix, not its own guesses).
Random weights are near-ties more often than trained ones, so this agreement is a floor.

The JSON is rewritten after every part, so a run cut short still reports what it measured.

Run:  python bench/fp8_thinker.py --out OUT.json [--batch 1,64] [--tokens 32] [--positions 2048]
          [--parts decode,agree] [--scaled --device cpu]   (a CPU dry run at test sizes)
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

from gpu_decode import MODES, sync, thinker_config, time_decode  # noqa: E402
from omni.layers.fp8 import dequantize_blocks  # noqa: E402
from omni.layers.fp8_format import Fp8Format  # noqa: E402
from omni.layers.fp8_modules import Fp8Linear, dequantize_experts, fp8_bytes, is_fp8_experts, quantize_  # noqa: E402
from omni.models.qwen3_omni.checkpoint.random_load import random_thinker  # noqa: E402
from report import machine, now_iso, say  # noqa: E402


class Report:
    def __init__(self, path: str | None, command: str) -> None:
        self.path, self.data = path, {"command": command, "date": now_iso(), "machine": machine()}

    def put(self, key: str, value) -> None:
        self.data[key] = value
        say(f"{key}: {json.dumps(value)}")
        if self.path:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            Path(self.path).write_text(json.dumps(self.data, indent=2) + "\n")


def weights_gb(model) -> dict:
    by = fp8_bytes(model)
    return {"total_gb": round(sum(by.values()) / 1e9, 3), **{k: round(v / 1e9, 3) for k, v in by.items()}}


def decode_rows(model, batches, tokens, device, mode) -> list[dict]:
    rows = []
    for b in batches:
        try:
            rows.append(time_decode(model, b, 32, tokens, 4, MODES[mode], device))
        except Exception as exc:  # one failing batch must not hide the others
            rows.append({"batch": b, "error": f"{type(exc).__name__}: {exc}"[:400]})
        say(json.dumps(rows[-1]))
    return rows


@torch.no_grad()
def copy_dequantized_(dst, src) -> None:
    """`dst` (a bf16 thinker of the same shapes) gets `src`'s weights, its FP8 ones dequantized."""
    mine = dict(dst.named_parameters())
    for name, param in src.named_parameters():
        if param.dtype != torch.float8_e4m3fn and not name.endswith("_scale_inv"):
            mine[name].copy_(param)
    for name, module in src.named_modules():
        if isinstance(module, Fp8Linear):
            target = dst.get_submodule(name).weight
            target.copy_(dequantize_blocks(module.weight, module.weight_scale_inv, target.dtype))
        elif is_fp8_experts(module):
            experts = dst.get_submodule(name)
            for param in ("gate_up_proj", "down_proj"):
                target = getattr(experts, param)
                target.copy_(dequantize_experts(getattr(module, param), getattr(module, param + "_scale_inv"),
                                                param, target.dtype))


@torch.no_grad()
def final_hidden(model, prompt: list[int], device: str) -> torch.Tensor:
    """The final normed hidden state at every prompt position ([P, H]), from omni's engine."""
    from omni.stages.ar.config import EngineConfig
    from omni.stages.ar.engine import AREngine
    from omni.stages.ar.sequence import SamplingParams

    layers = model.cfg.text.num_layers
    blocks = -(-(len(prompt) + 16) // 16)
    cfg = EngineConfig(block_size=16, num_blocks=blocks + 8, max_num_seqs=1, max_model_len=blocks * 16,
                       max_num_batched_tokens=512, device=device, tap_layers=(layers,))
    engine = AREngine(model, cfg)
    engine.add_request("tf", prompt, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True), return_hidden=True)
    rows = []
    while engine.has_unfinished():
        for out in engine.step():
            if layers in out.taps:
                rows.append(out.taps[layers])
    del engine
    return torch.cat(rows)[: len(prompt)].to(device)


@torch.no_grad()
def top1(model, hidden: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    return torch.cat([model.compute_logits(hidden[i : i + chunk]).argmax(-1) for i in range(0, hidden.shape[0], chunk)])


def agreement(fp8_model, cfg, device, positions: int, seed: int) -> dict:
    t0 = time.perf_counter()
    ref = random_thinker(cfg, device, torch.bfloat16, seed=seed)
    copy_dequantized_(ref, fp8_model)
    gen = torch.Generator().manual_seed(1234)
    prompt = torch.randint(0, min(cfg.text.vocab_size, 150000), (positions,), generator=gen).tolist()
    h_ref = final_hidden(ref, prompt, device)
    t_ref = top1(ref, h_ref)
    del ref
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    h_fp8 = final_hidden(fp8_model, prompt, device)
    t_fp8 = top1(fp8_model, h_fp8)
    cos = torch.nn.functional.cosine_similarity(h_ref.float(), h_fp8.float(), dim=-1)
    return {"positions": len(prompt), "top1_agreement": round((t_ref == t_fp8).float().mean().item(), 4),
            "hidden_cosine_mean": round(cos.mean().item(), 5), "hidden_cosine_min": round(cos.min().item(), 5),
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="1,64")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--positions", type=int, default=2048)
    ap.add_argument("--parts", default="decode,agree")
    ap.add_argument("--mode", default="graphs+triton", choices=sorted(MODES))
    ap.add_argument("--scaled", action="store_true", help="test sizes (a dry run)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    parts, batches = set(args.parts.split(",")), [int(b) for b in args.batch.split(",")]
    report = Report(args.out, " ".join(["python", "bench/fp8_thinker.py", *(argv if argv is not None else sys.argv[1:])]))
    cfg = thinker_config(args.scaled, Path("/tmp/omni-fp8-thinker"))
    t0 = time.perf_counter()
    model = random_thinker(cfg, args.device, torch.bfloat16, seed=0)
    sync(args.device)
    report.put("bf16_weights", {**weights_gb(model), "load_s": round(time.perf_counter() - t0, 1)})
    if "decode" in parts:
        report.put("bf16_decode", decode_rows(model, batches, args.tokens, args.device, args.mode))
    t0 = time.perf_counter()
    changed = quantize_(model, Fp8Format(), keep_fp8=True)
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    sync(args.device)
    fp8 = {**weights_gb(model), "modules_quantized": changed, "quantize_s": round(time.perf_counter() - t0, 1)}
    t = cfg.text
    kv_block = 16 * t.num_layers * 2 * t.num_kv_heads * t.head_dim * 2  # bf16 KV bytes of one 16-token block
    fp8["freed_gb"] = round(report.data["bf16_weights"]["total_gb"] - fp8["total_gb"], 3)
    fp8["kv_blocks_freed"] = int(fp8["freed_gb"] * 1e9 // kv_block)
    report.put("fp8_weights", fp8)
    if "decode" in parts:
        rows = decode_rows(model, batches, args.tokens, args.device, args.mode)
        report.put("fp8_decode", rows)
        ratios = {}
        for a, b in zip(report.data["bf16_decode"], rows):
            if "tpot_ms" in a and "tpot_ms" in b:
                ratios[str(a["batch"])] = round(b["tpot_ms"] / a["tpot_ms"], 3)
        report.put("fp8_over_bf16_tpot", ratios)
    if "agree" in parts:
        try:
            report.put("agreement", agreement(model, cfg, args.device, args.positions, seed=0))
        except Exception as exc:
            report.put("agreement", {"error": f"{type(exc).__name__}: {exc}"[:400]})
    if args.device.startswith("cuda"):
        report.put("peak_gpu_gib", round(torch.cuda.max_memory_allocated() / 2**30, 2))
    return report.data


if __name__ == "__main__":
    main()
