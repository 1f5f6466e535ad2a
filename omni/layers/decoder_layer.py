"""The decoder layer of the Qwen AR models on omni's engine: GQA attention over omni's paged cache
(Qwen3's q/k-normed front end, or Qwen2's with q/k/v biases), then a dense or sparse (top-k routed,
no shared expert) SwiGLU MLP.

Maths as transformers' Qwen3-Omni thinker and Qwen2.5-Omni thinker / talker: RMSNorm in float32,
softmax over all experts then top-k, renormalised when `norm_topk_prob`. The blocks are omni/layers'
(norms, attention front end, MoE), which run fused kernels on CUDA (`fused_ops`; a stage's
fused_ops=false arg keeps the plain torch ops).

`text_state_dict` names a Qwen omni thinker's text weights as these modules do (parameter names follow
the checkpoint, so loading is a name-for-name copy; routed experts are kept stacked: [E, 2I, H]
gate+up, [E, H, I] down).
"""

from __future__ import annotations

import torch
from torch import nn

from omni.layers.attention import QKVProjection
from omni.layers.configs import DecoderConfig
from omni.layers.mlp import GatedMLP
from omni.layers.moe import SparseMoE
from omni.layers.norms import RMSNorm
from omni.stages.ar.model_api import ForwardBatch


class Attention(QKVProjection):
    """The shared q/k/v front end over omni's paged cache."""

    def __init__(self, cfg: DecoderConfig, layer: int, qwen2: bool = False) -> None:
        super().__init__(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps,
                         qkv_bias=qwen2, qk_norm=not qwen2)
        self.layer = layer

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        q, k, v = self.qkv(x, cos, sin)
        out = batch.attend(self.layer, q, k, v, scale=self.head_dim**-0.5)
        return self.o_proj(out.reshape(x.shape[0], self.heads * self.head_dim))


class DecoderLayer(nn.Module):
    """`qwen2`: Qwen2's attention (q/k/v biases, no q/k norms; Qwen2.5-Omni's thinker and talker)."""

    def __init__(self, cfg: DecoderConfig, layer: int, qwen2: bool = False) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer, qwen2)
        if cfg.is_moe_layer(layer):
            self.mlp: nn.Module = SparseMoE(cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok,
                                            cfg.moe_intermediate_size, cfg.norm_topk_prob, cfg.hidden_act)
        else:
            self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(x), cos, sin, batch)
        h, x = self.post_attention_layernorm.add_forward(attn, x)
        return x + self.mlp(h)


def text_state_dict(state: dict[str, torch.Tensor], cfg: DecoderConfig) -> dict[str, torch.Tensor]:
    """A Qwen omni thinker's text-model weights named as these modules name them.

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
        if f"{p}.0.gate_proj.weight_scale_inv" in out:  # FP8 experts: their block scales stacked alike
            scale = lambda e, w: out.pop(f"{p}.{e}.{w}_proj.weight_scale_inv")  # noqa: E731
            out[f"{p}.gate_up_proj_scale_inv"] = torch.stack(
                [torch.cat([scale(e, "gate"), scale(e, "up")]) for e in range(cfg.num_experts)])
            out[f"{p}.down_proj_scale_inv"] = torch.stack([scale(e, "down") for e in range(cfg.num_experts)])
    return out
