"""Projections that read the same input, fused into one GEMM on a GPU (q/k/v; an MLP's gate and up).

At decode every projection is a small GEMM whose launch costs about what its weights take to read:
one GEMM over the concatenated weight is one launch instead of three (or two). The parts' weights
become views of the fused one (no extra memory) so every other use of them, loaders and TP
included, sees the same values. Only on CUDA (`fuse_model_projections`): on the CPU the parity
tests compare against transformers bit for bit, and a wider GEMM may block its sums differently.
"""

from __future__ import annotations

import torch
from torch import nn

from omni.layers import fused_ops


def fuse_linears(*parts: nn.Linear) -> nn.Linear | None:
    """One nn.Linear computing `cat([p(x) for p in parts], -1)`; the parts' weights (and biases)
    become views of its. None where they cannot be fused (other module types, dtypes or devices)."""
    if not all(type(p) is nn.Linear for p in parts):
        return None
    w0 = parts[0].weight
    if any(p.in_features != parts[0].in_features or p.weight.dtype != w0.dtype or p.weight.device != w0.device
           or (p.bias is None) != (parts[0].bias is None) for p in parts):
        return None
    fused = nn.Linear(w0.shape[1], sum(p.out_features for p in parts), bias=parts[0].bias is not None,
                      device="meta")
    with torch.no_grad():
        fused.weight = nn.Parameter(torch.cat([p.weight for p in parts]), requires_grad=False)
        if fused.bias is not None:
            fused.bias = nn.Parameter(torch.cat([p.bias for p in parts]), requires_grad=False)
        row = 0
        for p in parts:
            n = p.out_features
            p.weight = nn.Parameter(fused.weight[row : row + n], requires_grad=False)
            if p.bias is not None:
                p.bias = nn.Parameter(fused.bias[row : row + n], requires_grad=False)
            row += n
    return fused


def still_fused(fused: nn.Linear | None, *parts: nn.Module) -> bool:
    """Whether `fused` is the fused projection of `parts` as they are now (their weights still views
    of its): fusing again must keep it (a CUDA graph captured by an earlier engine reads its memory),
    while parts replaced since (e.g. quantized to FP8 in place) need a new fusion, or none."""
    if fused is None or not all(type(p) is nn.Linear for p in parts):
        return False
    ptr = fused.weight.untyped_storage().data_ptr()
    return all(p.weight.untyped_storage().data_ptr() == ptr for p in parts)


def fuse_model_projections(model: nn.Module) -> int:
    """Fuse every module's projections (`fuse_projections`) where its weights are on CUDA and the fused
    ops are on (a stage's `fused_ops=false` keeps them apart); returns how many modules fused."""
    count = 0
    for module in model.modules():
        fuse = getattr(module, "fuse_projections", None)
        weight = next(module.parameters(recurse=True), None) if fuse is not None else None
        if weight is not None and fused_ops.enabled(weight) and fuse():
            count += 1
    return count
