"""FP8 weights inside a decoder: the `Fp8Linear` that replaces an `nn.Linear`, FP8 routed experts,
and the two ways a model gets them (checkpoint pairs loaded into shells; bf16 weights quantized).

Why in place: the decoders (thinker, talker) keep their modules and names; only the converted
linears change class and the experts change dtype, so loading, CUDA graphs and fused ops are
untouched. `quantize_` is `--quantization fp8` (and the random FP8 model): on a device that runs
FP8 the weights become e4m3 + block scales; elsewhere each weight is replaced by its dequantized
quantization, so a CPU run computes on the numbers an FP8 GPU run holds.
"""

from __future__ import annotations

import logging
import re

import torch
from torch import nn

from omni.layers import fp8_gemm
from omni.layers.fp8 import E4M3, SCALE_SUFFIX, dequantize_blocks, fits_blocks, quantize_blocks, runs_fp8_linear
from omni.layers.fp8_format import BLOCK, Fp8Format, requested

EXPERT_PARAMS = ("gate_up_proj", "down_proj")
log = logging.getLogger("omni.fp8")


class Fp8Linear(nn.Module):
    """y = x W^T, W e4m3 [out, in] with float32 `weight_scale_inv` per 128x128 block (no bias)."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale_inv = nn.Parameter(scale, requires_grad=False)

    @classmethod
    def empty(cls, out_features: int, in_features: int, device=None) -> "Fp8Linear":
        blocks = (-(-out_features // BLOCK[0]), -(-in_features // BLOCK[1]))
        return cls(torch.empty(out_features, in_features, dtype=E4M3, device=device),
                   torch.ones(blocks, dtype=torch.float32, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_gemm.fp8_linear(x, self.weight, self.weight_scale_inv)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 block {BLOCK}"


def is_fp8_experts(experts: nn.Module) -> bool:
    return getattr(experts, "gate_up_proj", None) is not None and experts.gate_up_proj.dtype == E4M3


def _set_expert_params(experts: nn.Module, name: str, weight: torch.Tensor, scale: torch.Tensor) -> None:
    setattr(experts, name, nn.Parameter(weight, requires_grad=False))
    setattr(experts, name + SCALE_SUFFIX, nn.Parameter(scale, requires_grad=False))


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


_PER_EXPERT = re.compile(r"^(.*\.experts)\.\d+\.(gate|up|down)_proj\.weight$")


def convert_shells_(model: nn.Module, names) -> None:
    """Make room for the FP8 pairs a state dict holds (`names`, as the model names them, or per
    expert as checkpoints do): each `X.weight_scale_inv` turns linear X into an empty `Fp8Linear`,
    each expert scale (stacked `X.gate_up_proj_scale_inv`, or `X.E.gate_proj.weight_scale_inv`)
    makes experts X e4m3 with room for their block scales."""
    for key in [k for k in names if k.endswith(SCALE_SUFFIX)]:
        base = key[: -len(SCALE_SUFFIX)]
        per_expert = _PER_EXPERT.match(base)
        if per_expert:
            owner, param = per_expert.group(1), "down_proj" if per_expert.group(2) == "down" else "gate_up_proj"
        else:
            owner, _, param = base.rpartition(".")
        module = model.get_submodule(owner)
        if param == "weight" and isinstance(module, nn.Linear):
            if module.bias is not None:
                raise ValueError(f"{owner}: FP8 linears take no bias")
            _replace(model, owner, Fp8Linear.empty(module.out_features, module.in_features, module.weight.device))
        elif param in EXPERT_PARAMS and getattr(module, param).dtype != E4M3:
            old = getattr(module, param)
            experts, n, k = old.shape
            rows = 2 * -(-(n // 2) // BLOCK[0]) if param == "gate_up_proj" else -(-n // BLOCK[0])
            _set_expert_params(module, param, torch.empty(old.shape, dtype=E4M3, device=old.device),
                               torch.ones(experts, rows, -(-k // BLOCK[1]), dtype=torch.float32, device=old.device))


def quantize_experts(weight: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked experts quantized as checkpoints store them: gate and up each in their own blocks."""
    if name == "gate_up_proj":
        inner = weight.shape[1] // 2
        (qg, sg), (qu, su) = quantize_blocks(weight[:, :inner]), quantize_blocks(weight[:, inner:])
        return torch.cat((qg, qu), 1), torch.cat((sg, su), 1)
    return quantize_blocks(weight)


def dequantize_experts(q: torch.Tensor, s: torch.Tensor, name: str, dtype) -> torch.Tensor:
    """`quantize_experts` undone: stacked e4m3 experts and their scales -> weights in `dtype`."""
    if name == "gate_up_proj":
        inner, blocks = q.shape[1] // 2, s.shape[1] // 2
        return torch.cat((dequantize_blocks(q[:, :inner], s[:, :blocks], dtype),
                          dequantize_blocks(q[:, inner:], s[:, blocks:], dtype)), 1)
    return dequantize_blocks(q, s, dtype)


@torch.no_grad()
def quantize_(model: nn.Module, fmt: Fp8Format, keep_fp8: bool) -> int:
    """Quantize every decoder linear and expert stack omni runs in FP8 (`runs_fp8_linear`, less the
    format's `modules_to_not_convert`), one module at a time (no second copy of the model);
    `keep_fp8=False`: dequantized back in place. Returns how many modules changed."""
    changed = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and runs_fp8_linear(f"{name}.weight") and fmt.converts(name):
            q, s = quantize_blocks(module.weight)
            if keep_fp8 and module.bias is None and fits_blocks(q.shape):
                _replace(model, name, Fp8Linear(q, s))
            else:
                module.weight.copy_(dequantize_blocks(q, s, module.weight.dtype))
            changed += 1
        elif (all(isinstance(getattr(module, p, None), nn.Parameter) for p in EXPERT_PARAMS)
              and runs_fp8_linear(f"{name}.0.gate_proj.weight") and fmt.converts(name) and not is_fp8_experts(module)):
            inner = module.down_proj.shape[-1]
            whole = fits_blocks(module.down_proj.shape) and inner % BLOCK[0] == 0
            for param in EXPERT_PARAMS:
                weight = getattr(module, param)
                q, s = quantize_experts(weight, param)
                if keep_fp8 and whole:
                    _set_expert_params(module, param, q, s)
                else:
                    weight.copy_(dequantize_experts(q, s, param, weight.dtype))
                del q, s
            changed += 1
    log.info("%s: %d modules quantized to FP8 (%s)", type(model).__name__, changed,
             "e4m3 kept for the FP8 kernels" if keep_fp8 else "dequantized: no FP8 kernels on this device")
    return changed


def quantize_at_load_(model: nn.Module, quantization: str, checkpoint: Fp8Format | None, keep_fp8: bool) -> int:
    """A stage's `quantization` arg applied to a loaded model: "fp8" quantizes a bf16 checkpoint's
    weights; a checkpoint that is FP8 already keeps its own (its bf16 modules stay bf16)."""
    fmt = requested(quantization)
    if fmt is None or checkpoint is not None:
        return 0
    return quantize_(model, fmt, keep_fp8)


def fp8_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of the model's parameters and buffers by dtype name (weights memory reports)."""
    out: dict[str, int] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        key = str(t.dtype).replace("torch.", "")
        out[key] = out.get(key, 0) + t.numel() * t.element_size()
    return out
