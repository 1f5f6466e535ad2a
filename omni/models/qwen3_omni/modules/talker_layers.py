"""Building blocks shared by the talker decoder and its code predictor.

Plain torch modules whose parameter names follow the checkpoint (`q_proj`, `q_norm`,
`mlp.gate`, `mlp.experts.gate_up_proj`, `mlp.shared_expert_gate`, ...), so that loading is a
name-for-name copy. The maths follows transformers' Qwen3-Omni talker: RMSNorm computed in
float32, per-head q/k RMSNorm before RoPE, rotate-half RoPE, softmax-then-top-k routing
(optionally renormalised), and a sigmoid-gated shared expert added to the routed experts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni.layers import fused_ops
from omni.layers.moe_routed import per_expert, routed_experts
from omni.models.weights import CheckpointError
from omni.models.qwen3_omni.modules.thinker_layers import Experts, RMSNorm, Router  # shared with the thinker


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain 1-D RoPE cos/sin, [*positions.shape, head_dim] (the code predictor's rope)."""
    freqs = positions[..., None].float() * inv_freq.to(positions.device)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`x` [..., heads, T, head_dim] or [T, heads, head_dim] with cos/sin broadcastable."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class QKVProjection(nn.Module):
    """q/k/v/o projections plus the per-head q/k norms (the attention maths lives elsewhere)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float, bias: bool = False) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`x` [..., T, hidden] -> q [..., T, heads, hd], k and v [..., T, kv_heads, hd], RoPE applied.

        cos/sin are [..., T, hd]; they broadcast over the head axis.
        """
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.heads, self.head_dim)
        k = self.k_proj(x).view(*lead, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(*lead, self.kv_heads, self.head_dim)
        if self._fused(x, cos):  # the thinker's q/k-norm + rope kernel: one launch for both
            rows, d = -1, self.head_dim
            c = cos.expand(*lead, d).reshape(rows, d)
            s = sin.expand(*lead, d).reshape(rows, d)
            q, k = fused_ops.qk_norm_rope(q.reshape(rows, self.heads, d), k.reshape(rows, self.kv_heads, d),
                                          self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, c, s)
            return q.view(*lead, self.heads, d), k.view(*lead, self.kv_heads, d), v
        c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
        return apply_rope(self.q_norm(q), c, s), apply_rope(self.k_norm(k), c, s), v

    def _fused(self, x: torch.Tensor, cos: torch.Tensor) -> bool:
        return (fused_ops.enabled(x) and self.q_norm.weight.dtype == self.k_norm.weight.dtype == cos.dtype == x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SharedExpertMoE(nn.Module):
    """Top-k routed experts plus a sigmoid-gated shared expert (the talker's MLP in every layer)."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, moe_inner: int, shared_inner: int, norm_topk: bool) -> None:
        super().__init__()
        self.top_k, self.norm_topk, self.num_experts = top_k, norm_topk, num_experts
        self.gate = Router(hidden, num_experts)
        self.experts = Experts(num_experts, hidden, moe_inner)
        self.shared_expert = SwiGLU(hidden, shared_inner)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        h = x.reshape(-1, shape[-1])
        shared = self.shared_expert(h)
        logits = F.linear(h, self.gate.weight)
        if fused_ops.enabled(h):  # the thinker's router kernel: softmax, top-k, renormalise in one launch
            weights, chosen = fused_ops.route_topk(logits, self.top_k, self.norm_topk, logits.dtype)
        else:
            probs = torch.softmax(logits, dim=-1, dtype=torch.float)
            weights, chosen = torch.topk(probs, self.top_k, dim=-1)
            if self.norm_topk:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            weights = weights.to(logits.dtype)
        experts = (h, weights, chosen, self.experts.gate_up_proj, self.experts.down_proj, F.silu)
        # CUDA: no host syncs (CUDA graphs); CPU: the per-expert loop transformers' references match
        routed = routed_experts(*experts) if h.is_cuda else per_expert(*experts)
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


class ResizeMLP(nn.Module):
    """Thinker width -> talker width (`text_projection`, `hidden_projection`)."""

    def __init__(self, in_dim: int, inner: int, out_dim: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(in_dim, inner, bias=True)
        self.linear_fc2 = nn.Linear(inner, out_dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


def load_weights(module: nn.Module, tensors, prefix: str) -> None:
    """Copy `tensors[prefix + name]` into every parameter of `module`.

    `tensors` is any mapping from checkpoint names to tensors (a state dict or a lazy
    safetensors view). Routed experts are accepted fused (`experts.gate_up_proj`, as
    transformers holds them) or per expert (`experts.{e}.gate_proj.weight`, as checkpoints
    store them).
    """
    for name, param in module.named_parameters():
        key = prefix + name
        if key in tensors:
            value = tensors[key]
        elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            value = _stack_experts(tensors, key, param.shape[0])
        else:
            raise CheckpointError(f"checkpoint has no weight {key!r}")
        if tuple(value.shape) != tuple(param.shape):
            raise CheckpointError(f"weight {key!r} has shape {tuple(value.shape)}, expected {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(value.to(param.dtype))


def _stack_experts(tensors, key: str, num_experts: int) -> torch.Tensor:
    base = key.rsplit(".", 1)[0]  # "...mlp.experts"
    try:
        if key.endswith("gate_up_proj"):
            return torch.stack(
                [torch.cat((tensors[f"{base}.{e}.gate_proj.weight"], tensors[f"{base}.{e}.up_proj.weight"]), 0)
                 for e in range(num_experts)]
            )
        return torch.stack([tensors[f"{base}.{e}.down_proj.weight"] for e in range(num_experts)])
    except KeyError as exc:
        raise CheckpointError(f"checkpoint has no weight {key!r} nor its per-expert form ({exc})") from None
