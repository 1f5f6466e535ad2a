"""Mixture-of-experts MLPs: a router, stacked SwiGLU experts, top-k routing, and the two MoE
blocks the Qwen3 decoders use (routed experts only; routed plus a gated shared expert).

Routing is transformers' order: softmax over all experts in float32, top-k, renormalised when
`norm_topk`; on CUDA with triton one fused kernel (`fused_ops.route_topk`). The experts run
without host syncs on CUDA (`moe_routed.routed_experts`); on CPU one grouped GEMM per
projection where torch has it (`grouped_on_cpu`), else one GEMM per hit expert.
Experts are kept stacked ([E, 2I, H] gate+up, [E, H, I] down), named as the checkpoints
(`mlp.gate.weight`, `mlp.experts.gate_up_proj`, `mlp.shared_expert.*`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni import env
from omni.layers import fused_ops
from omni.layers.fp8_modules import dequantize_experts, is_fp8_experts
from omni.layers.mlp import ACTIVATIONS, GatedMLP
from omni.layers.moe_fp8 import fused_fp8_experts
from omni.layers.moe_routed import grouped_experts, grouped_on_cpu, per_expert, routed_experts


class Router(nn.Module):
    def __init__(self, hidden: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden))


class Experts(nn.Module):
    def __init__(self, num_experts: int, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.zeros(num_experts, 2 * inner, hidden))
        self.down_proj = nn.Parameter(torch.zeros(num_experts, hidden, inner))


def route_topk(logits: torch.Tensor, top_k: int, norm_topk: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> routing weights [T, k] (the logits' dtype) and expert ids [T, k], best first."""
    if fused_ops.enabled(logits):
        return fused_ops.route_topk(logits, top_k, norm_topk, logits.dtype)
    probs = logits.softmax(-1, dtype=torch.float)
    weights, chosen = torch.topk(probs, top_k, dim=-1)
    if norm_topk:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights.to(logits.dtype), chosen


class SparseMoE(nn.Module):
    """Top-k routed experts; each token's output is the routing-weighted sum of its experts.

    `cpu_grouped=False` keeps the per-expert loop on CPU even where torch has a grouped GEMM.
    """

    def __init__(self, hidden: int, num_experts: int, top_k: int, inner: int, norm_topk: bool,
                 act: str = "silu", cpu_grouped: bool = True) -> None:
        super().__init__()
        self.top_k, self.norm_topk, self.num_experts = top_k, norm_topk, num_experts
        self.gate = Router(hidden, num_experts)
        self.experts = Experts(num_experts, hidden, inner)
        self.act = ACTIVATIONS[act]
        self.cpu_grouped = cpu_grouped

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Routing weights [T, k] (x's dtype) and expert ids [T, k], best first."""
        return route_topk(F.linear(x, self.gate.weight), self.top_k, self.norm_topk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.route(x)
        if is_fp8_experts(self.experts):
            return fp8_routed_experts(x, weights, chosen, self.experts, self.act)
        experts = (x, weights, chosen, self.experts.gate_up_proj, self.experts.down_proj, self.act)
        if x.is_cuda:  # no host syncs (CUDA graphs)
            return routed_experts(*experts)
        return grouped_experts(*experts) if self.cpu_grouped and grouped_on_cpu(x) else per_expert(*experts)


def fp8_routed_experts(x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor, experts: nn.Module,
                       act) -> torch.Tensor:
    """FP8 experts (`fp8_modules`): the fused FP8 Triton kernels on CUDA (every MoE backend: FP8 has
    only this one); off CUDA (tests) the per-expert loop over the dequantized weights."""
    e = experts
    if act is F.silu and (x.is_cuda or env.triton_interpret()):
        return fused_fp8_experts(x, weights, chosen, e.gate_up_proj, e.gate_up_proj_scale_inv, e.down_proj,
                                 e.down_proj_scale_inv, act_fp8=x.is_cuda)
    gate_up = dequantize_experts(e.gate_up_proj, e.gate_up_proj_scale_inv, "gate_up_proj", x.dtype)
    down = dequantize_experts(e.down_proj, e.down_proj_scale_inv, "down_proj", x.dtype)
    return per_expert(x, weights, chosen, gate_up, down, act)


class SharedExpertMoE(SparseMoE):
    """Top-k routed experts plus a sigmoid-gated shared expert (the talker's MLP in every layer).

    On CPU the per-expert loop (the order transformers' references sum in)."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, moe_inner: int, shared_inner: int, norm_topk: bool) -> None:
        super().__init__(hidden, num_experts, top_k, moe_inner, norm_topk, cpu_grouped=False)
        self.shared_expert = GatedMLP(hidden, shared_inner)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        h = x.reshape(-1, shape[-1])
        shared = self.shared_expert(h)
        routed = super().forward(h)
        return (routed + torch.sigmoid(self.shared_expert_gate(h)) * shared).reshape(shape)


def tied_router_experts(router_weight: torch.Tensor) -> int:
    """How many experts' router rows repeat another expert's row ([E, H] -> count).

    Such experts get the same score for every token, so choosing among them is an exact tie
    that `torch.topk` breaks in a device-specific order (on CUDA the lowest index first, on
    CPU not): the same checkpoint then routes, and speaks, differently on CPU and CUDA.
    Trained checkpoints have none; an all-zero router (transformers' init of the talker's
    router, kept by a tiny random checkpoint that does not refill it) ties every expert.
    """
    rows = router_weight.detach().float().cpu()
    return int(rows.shape[0] - torch.unique(rows, dim=0).shape[0])
