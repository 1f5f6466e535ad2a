"""The code predictor's whole frame on the fused kernels (`predictor_kernels`): ~27 launches a step.

Per step and layer: RMSNorm + merged q/k/v projection (one kernel), q/k norm + RoPE + cache write +
attention (one), o projection + residual (one), RMSNorm + merged gate/up + SwiGLU (one), down +
residual (one); per step the final norm + that group's head (one) and sampling + the embedding
lookup (one). The merged weights are copies made once (the module's own stay for the eager path).
Runs on the static buffers of `CodePredictorGraphs` and is what its CUDA graph records.
"""

from __future__ import annotations

from typing import Any

import torch

from omni.layers import predictor_kernels as pk


def _cat(*tensors: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensors[0] is None else torch.cat(tensors).contiguous()


class FusedPredictorFrame:
    """`predictor`: a code predictor module (layers with `self_attn` q/k/v/o + q/k norms, `mlp`
    gate/up/down, two RMSNorms; `model.norm`, `lm_head[g]`, `model.codec_embedding[g]`, optional
    `small_to_mtp_projection`); `cos` / `sin`: [num_code_groups, head_dim] RoPE tables."""

    def __init__(self, predictor, cos: torch.Tensor, sin: torch.Tensor, top_k: int, top_p: float) -> None:
        self.groups = predictor.num_code_groups
        self.top_k, self.top_p = top_k, top_p
        self.cos, self.sin = cos.contiguous(), sin.contiguous()
        self.layers: list[dict[str, Any]] = []
        with torch.no_grad():
            for layer in predictor.model.layers:
                a, mlp = layer.self_attn, layer.mlp
                self.layers.append({
                    "ln1": layer.input_layernorm.weight, "eps1": layer.input_layernorm.eps,
                    "qkv": _cat(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight),
                    "qkv_bias": _cat(a.q_proj.bias, a.k_proj.bias, a.v_proj.bias),
                    "q_norm": a.q_norm.weight, "k_norm": a.k_norm.weight, "qk_eps": a.q_norm.eps, "heads": a.heads,
                    "o": a.o_proj.weight, "o_bias": a.o_proj.bias,
                    "ln2": layer.post_attention_layernorm.weight, "eps2": layer.post_attention_layernorm.eps,
                    "gate_up": pk.interleave_pairs(mlp.gate_proj.weight, mlp.up_proj.weight), "down": mlp.down_proj.weight,
                })
        self.norm, self.norm_eps = predictor.model.norm.weight, predictor.model.norm.eps
        self.heads = [head.weight for head in predictor.lm_head]
        self.tables = [table.weight for table in predictor.model.codec_embedding]
        proj = predictor.small_to_mtp_projection
        self.proj = None if proj is None else (proj.weight, proj.bias)
        self.counters = pk.split_counters(self.norm.device)  # this frame's split-K arrivals (one stream)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, **kw) -> torch.Tensor:
        return pk.linear(x, weight, counters=self.counters, **kw)

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.proj is None else self._linear(x, self.proj[0], bias=self.proj[1])

    def run(self, s) -> None:
        """One frame for the rows of static buffers `s` (hidden, code0, temperature, seed, frame,
        keys, values -> codes, embeds), as `CodePredictorGraphs._body` computes it eagerly."""
        batch = s.hidden.shape[0]
        x = self._project(torch.stack((s.hidden, s.code0), dim=1).view(2 * batch, -1))
        start, new = 0, 2
        for g in range(self.groups - 1):
            h = x
            for p, keys, values in zip(self.layers, s.keys, s.values):
                qkv = self._linear(h, p["qkv"], norm_weight=p["ln1"], eps=p["eps1"], bias=p["qkv_bias"])
                att = pk.static_attention(qkv, keys, values, p["q_norm"], p["k_norm"], p["qk_eps"], self.cos,
                                          self.sin, start, new, p["heads"])
                h = self._linear(att, p["o"], bias=p["o_bias"], residual=h)
                act = self._linear(h, p["gate_up"], norm_weight=p["ln2"], eps=p["eps2"], glu=True)
                h = self._linear(act, p["down"], residual=h)
            last = h.view(batch, new, -1)[:, -1]
            logits = self._linear(last, self.heads[g], norm_weight=self.norm, eps=self.norm_eps)
            pk.sample_embed(logits, s.temperature, s.seed, s.frame, self.tables[g], s.codes[:, g], s.embeds[:, g],
                            top_k=self.top_k, top_p=self.top_p, group=g, groups_per_frame=self.groups - 1)
            x = self._project(s.embeds[:, g])
            start, new = start + new, 1
