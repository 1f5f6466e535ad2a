"""Routed-expert MLP without host syncs, for CUDA (and so for CUDA graphs).

The CPU paths of the thinker and talker loop over the experts a batch hit (`unique().tolist()`,
a host sync per layer) or size their groups with `bincount` (a sync on CUDA). Here, by backend:
- "triton" (default for bf16/fp16 SwiGLU on CUDA when triton imports): the fused kernels of
  `moe_triton`, which read only the chosen experts' weights;
- "grouped" (bf16 on SM80+): token-expert pairs sorted by expert, group offsets from a
  scatter-add count, one grouped GEMM per projection (torch's `grouped_mm`);
- "bmm" (anything else; meant for small models): each token-expert pair gathers its expert's
  matrices and runs one batched matmul.
All return sum_k weight_k * expert_k(x) per token, like the loops they replace.
A stage's `moe_backend` arg (`use_moe_backend`, once at set-up; or the `backend` argument) forces
one, for A/B runs.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from omni import env
from omni.layers import moe_triton

_GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
BACKENDS = ("triton", "grouped", "bmm")


class MoeBackendError(ValueError):
    """An unknown backend name, or one that cannot run these tensors."""


_FORCED: str | None = None  # this process's backend: set once by the stage (`use_moe_backend`)


def use_moe_backend(name: str | None) -> None:
    """Force `name` for this process ("" or None: chosen by dtype and device); a stage's
    `moe_backend` arg, applied at set-up."""
    global _FORCED
    if name and name not in BACKENDS:
        raise MoeBackendError(f"unknown MoE backend {name!r}; expected one of {BACKENDS}")
    _FORCED = name or None


def grouped_ok(x: torch.Tensor) -> bool:
    return (_GROUPED_MM is not None and x.is_cuda and x.dtype == torch.bfloat16
            and torch.cuda.get_device_capability(x.device) >= (8, 0))


def grouped_on_cpu(x: torch.Tensor) -> bool:
    """torch's grouped GEMM also runs on CPU (the thinker's CPU path uses `grouped_experts`)."""
    return _GROUPED_MM is not None and x.device.type == "cpu"


def triton_ok(x: torch.Tensor, act: Callable, forced: bool = False) -> bool:
    """The fused kernels hard-code SiLU; on CPU they run only in triton's interpreter (tests)."""
    if moe_triton.triton is None or act is not F.silu:
        return False
    if forced:
        return x.is_cuda or env.triton_interpret()
    return x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)


def choose_backend(x: torch.Tensor, act: Callable, backend: str | None = None) -> str:
    wanted = backend or _FORCED
    if wanted is None:
        return "triton" if triton_ok(x, act) else "grouped" if grouped_ok(x) else "bmm"
    if wanted not in BACKENDS:
        raise MoeBackendError(f"unknown MoE backend {wanted!r}; expected one of {BACKENDS}")
    if (wanted == "triton" and not triton_ok(x, act, forced=True)) or (wanted == "grouped" and not grouped_ok(x)):
        raise MoeBackendError(f"MoE backend {wanted!r} cannot run {x.dtype} on {x.device}")
    return wanted


def routed_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    chosen: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor],
    backend: str | None = None,
) -> torch.Tensor:
    """`x` [T, H]; `weights`, `chosen` [T, k]; `gate_up` [E, 2I, H]; `down` [E, H, I] -> [T, H]."""
    which = choose_backend(x, act, backend)
    if which == "triton":
        return moe_triton.fused_routed_experts(x, weights, chosen, gate_up, down)
    if which == "grouped":
        return grouped_experts(x, weights, chosen, gate_up, down, act)
    top_k = chosen.shape[1]
    flat = chosen.reshape(-1)
    token = torch.arange(x.shape[0], device=x.device).repeat_interleave(top_k)
    h = torch.bmm(gate_up[flat], x[token, :, None]).squeeze(-1)  # [T*k, 2I]
    gate, up = h.chunk(2, dim=-1)
    y = torch.bmm(down[flat], (act(gate) * up)[:, :, None]).squeeze(-1)  # [T*k, H]
    y = y * weights.reshape(-1)[:, None].to(y.dtype)
    return torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))


def grouped_experts(x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor, gate_up: torch.Tensor,
                    down: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Token-expert pairs sorted by expert, group offsets from a scatter-add count (no host sync),
    one grouped GEMM per projection."""
    flat = chosen.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(gate_up.shape[0], dtype=torch.int32, device=x.device)
    counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offsets = counts.cumsum(0, dtype=torch.int32)
    token = order // chosen.shape[1]
    h = _GROUPED_MM(x[token], gate_up.transpose(1, 2), offs=offsets)
    gate, up = h.chunk(2, dim=-1)
    y = _GROUPED_MM(act(gate) * up, down.transpose(1, 2), offs=offsets)
    y = y * weights.reshape(-1)[order, None].to(y.dtype)
    return torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))


def per_expert(x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor, gate_up: torch.Tensor,
               down: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The reference loop over the experts the batch hit (a host sync per layer: CPU only)."""
    out = torch.zeros_like(x)
    for expert in chosen.unique().tolist():
        token, slot = torch.where(chosen == expert)
        gate, up = F.linear(x[token], gate_up[expert]).chunk(2, dim=-1)
        y = F.linear(act(gate) * up, down[expert]) * weights[token, slot, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out
