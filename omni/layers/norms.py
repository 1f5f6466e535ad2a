"""RMSNorm, the one norm the decoders share (thinker, talker, code predictor, code2wav).

Maths as transformers': normalise in float32, round to the input dtype, then scale by the
weight. On CUDA with triton the fused kernel (`fused_ops.rms_norm`) runs instead, with the
same roundings; `add_forward` folds the residual add into that kernel.
"""

from __future__ import annotations

import torch
from torch import nn

from omni.layers import fused_ops


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fused(x):
            return fused_ops.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): one kernel on the fused path."""
        if self._fused(x) and residual.dtype == x.dtype:
            return fused_ops.rms_norm(x, self.weight, self.eps, residual=residual)
        summed = residual + x
        return self(summed), summed

    def _fused(self, x: torch.Tensor) -> bool:
        return fused_ops.enabled(x) and self.weight.dtype == x.dtype


class LayerScale(nn.Module):
    """A learned per-channel scale on a residual branch (Mimi's and code2wav's transformers)."""

    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x
