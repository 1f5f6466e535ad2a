"""The thinker's text decoder layers (Qwen3-MoE): q/k-normed GQA attention over omni's paged
cache, and a dense or sparse (top-k routed, no shared expert) SwiGLU MLP.

Parameter names follow the checkpoint (`self_attn.q_proj`, `mlp.gate`, ...) so loading is a
name-for-name copy; the routed experts are kept stacked ([E, 2I, H] gate+up, [E, H, I] down).
Maths as transformers' Qwen3-Omni thinker: RMSNorm in float32, softmax over all experts then
top-k, renormalised when `norm_topk_prob`. On CUDA with triton the norms, q/k norm + RoPE and
the routing run as fused kernels (`fused_ops`; a stage's fused_ops=false arg keeps the plain torch ops).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni.layers import fused_ops
from omni.models.qwen3_omni.config import DecoderConfig
from omni.layers.moe_routed import grouped_experts, grouped_on_cpu, per_expert, routed_experts
from omni.models.qwen3_omni.modules.rope import apply_rope
from omni.stages.ar.model_api import ForwardBatch

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu}


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


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.heads, self.head_dim)
        k = self.k_proj(x).view(t, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.kv_heads, self.head_dim)
        if fused_ops.enabled(x) and self.q_norm.weight.dtype == self.k_norm.weight.dtype == cos.dtype == sin.dtype == x.dtype:
            q, k = fused_ops.qk_norm_rope(q, k, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, cos, sin)
        else:
            q, k = apply_rope(self.q_norm(q), cos, sin), apply_rope(self.k_norm(k), cos, sin)
        out = batch.attend(self.layer, q, k, v, scale=self.head_dim**-0.5)
        return self.o_proj(out.reshape(t, self.heads * self.head_dim))


class DenseMLP(nn.Module):
    def __init__(self, hidden: int, inner: int, act: str) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, hidden: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden))


class Experts(nn.Module):
    def __init__(self, num_experts: int, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.zeros(num_experts, 2 * inner, hidden))
        self.down_proj = nn.Parameter(torch.zeros(num_experts, hidden, inner))


class SparseMoE(nn.Module):
    """Top-k routed experts; each token's output is the routing-weighted sum of its experts.

    On CUDA `moe_routed.routed_experts` (no host sync, no per-expert launches); on CPU one
    grouped GEMM per projection where torch has it, else one GEMM per hit expert.
    """

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.top_k, self.norm_topk = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.num_experts = cfg.num_experts
        self.gate = Router(cfg.hidden_size, cfg.num_experts)
        self.experts = Experts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Routing weights [T, k] (x's dtype) and expert ids [T, k], best first."""
        logits = F.linear(x, self.gate.weight)
        if fused_ops.enabled(x):
            return fused_ops.route_topk(logits, self.top_k, self.norm_topk, x.dtype)
        probs = logits.softmax(-1, dtype=torch.float)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)  # [T, k]
        if self.norm_topk:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights.to(x.dtype), chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.route(x)
        experts = (x, weights, chosen, self.experts.gate_up_proj, self.experts.down_proj, self.act)
        if x.is_cuda:  # no host syncs (CUDA graphs)
            return routed_experts(*experts)
        return grouped_experts(*experts) if grouped_on_cpu(x) else per_expert(*experts)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        if cfg.is_moe_layer(layer):
            self.mlp: nn.Module = SparseMoE(cfg)
        else:
            self.mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(x), cos, sin, batch)
        h, x = self.post_attention_layernorm.add_forward(attn, x)
        return x + self.mlp(h)


def text_state_dict(state: dict[str, torch.Tensor], cfg: DecoderConfig) -> dict[str, torch.Tensor]:
    """The thinker text model's weights named as this module names them.

    Accepts checkpoint names (`thinker.model.layers.N...`, per-expert tensors) and transformers'
    module names (`thinker.model.language_model.layers.N...`, stacked experts), with or
    without the `thinker.` prefix; audio-tower and vision weights are left out.
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.startswith("thinker."):
            name = name[len("thinker.") :]
        name = name.replace("model.language_model.", "model.", 1)
        if name.startswith(("audio_tower.", "visual.", "model.audio_tower.", "model.visual.")):
            continue
        out[name] = tensor
    for layer in range(cfg.num_layers):
        p = f"model.layers.{layer}.mlp.experts"
        if f"{p}.0.gate_proj.weight" not in out:
            continue
        gate_up, down = [], []
        for e in range(cfg.num_experts):
            gate_up.append(torch.cat([out.pop(f"{p}.{e}.gate_proj.weight"), out.pop(f"{p}.{e}.up_proj.weight")]))
            down.append(out.pop(f"{p}.{e}.down_proj.weight"))
        out[f"{p}.gate_up_proj"], out[f"{p}.down_proj"] = torch.stack(gate_up), torch.stack(down)
    return out
