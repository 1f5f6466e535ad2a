"""Routed-expert MLP without host syncs, for CUDA (and so for CUDA graphs).

The CPU paths of the thinker and talker loop over the experts a batch hit (`unique().tolist()`,
a host sync per layer) or size their groups with `bincount` (a sync on CUDA). Here:
- bf16 on SM80+: token-expert pairs sorted by expert, group offsets from a scatter-add count,
  one grouped GEMM per projection (torch's `grouped_mm`);
- otherwise (float32 or older GPUs; meant for small models): each token-expert pair gathers its
  expert's matrices and runs one batched matmul.
Both return sum_k weight_k * expert_k(x) per token, like the loops they replace.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

_GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def grouped_ok(x: torch.Tensor) -> bool:
    return (_GROUPED_MM is not None and x.is_cuda and x.dtype == torch.bfloat16
            and torch.cuda.get_device_capability(x.device) >= (8, 0))


def routed_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    chosen: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """`x` [T, H]; `weights`, `chosen` [T, k]; `gate_up` [E, 2I, H]; `down` [E, H, I] -> [T, H]."""
    top_k = chosen.shape[1]
    flat = chosen.reshape(-1)
    if grouped_ok(x):
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(gate_up.shape[0], dtype=torch.int32, device=x.device)
        counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        offsets = counts.cumsum(0, dtype=torch.int32)
        token = order // top_k
        h = _GROUPED_MM(x[token], gate_up.transpose(1, 2), offs=offsets)
        gate, up = h.chunk(2, dim=-1)
        y = _GROUPED_MM(act(gate) * up, down.transpose(1, 2), offs=offsets)
        y = y * weights.reshape(-1)[order, None].to(y.dtype)
        return torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))
    token = torch.arange(x.shape[0], device=x.device).repeat_interleave(top_k)
    h = torch.bmm(gate_up[flat], x[token, :, None]).squeeze(-1)  # [T*k, 2I]
    gate, up = h.chunk(2, dim=-1)
    y = torch.bmm(down[flat], (act(gate) * up)[:, :, None]).squeeze(-1)  # [T*k, H]
    y = y * weights.reshape(-1)[:, None].to(y.dtype)
    return torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))
