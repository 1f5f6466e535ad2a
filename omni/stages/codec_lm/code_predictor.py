"""The talker's code predictor: a small dense decoder that fills code groups 1..G-1 of a frame.

Per talker step and per sequence it runs its own short autoregressive loop: prefill with
[talker's last hidden state, embedding of code 0], then one token per remaining group, group
`g` read by `lm_head[g-1]` and fed back through `codec_embedding[g-1]`. The loop is at most
G+1 tokens long and every sequence of a batch is at the same point, so it runs batched over
the talker's running sequences with a small dense KV cache that lives for one call.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from omni.layers.attention import QKVProjection, sdpa
from omni.layers.configs import DecoderConfig
from omni.layers.mlp import GatedMLP
from omni.layers.norms import RMSNorm
from omni.layers.rotary import rope_cos_sin, rope_inv_freq
from omni.stages.ar.sampler import RowParams, SampleMode, sample_rows

# Sampling used by transformers for the code predictor when the talker samples.
PREDICTOR_TOP_K = 50
PREDICTOR_TOP_P = 0.8


class _Layer(nn.Module):
    def __init__(self, s: DecoderConfig) -> None:
        super().__init__()
        bias = bool(s.raw.get("attention_bias", False))
        self.self_attn = QKVProjection(s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim, s.rms_norm_eps, bias)
        self.mlp = GatedMLP(s.hidden_size, s.intermediate_size)
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: list[torch.Tensor]) -> torch.Tensor:
        """`x` [B, T, H]; `cache` is [k, v] ([B, kv_heads, past, hd]) or empty, extended in place."""
        q, k, v = self._qkv(x, cos, sin)
        if cache:
            k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
        cache[:] = [k, v]
        return self._attend_mlp(x, q, k, v)

    def forward_static(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                       values: torch.Tensor, start: int) -> torch.Tensor:
        """`forward` over a preallocated cache ([B, kv_heads, max_len, hd]): writes positions
        [start, start + T) in place and attends to [0, start + T) (the graph path's layer)."""
        q, k, v = self._qkv(x, cos, sin)
        end = start + q.shape[2]
        keys[:, :, start:end].copy_(k)
        values[:, :, start:end].copy_(v)
        return self._attend_mlp(x, q, keys[:, :, :end], values[:, :, :end])

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v = self.self_attn.qkv(self.input_layernorm(x), cos, sin)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _attend_mlp(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        attn = self.self_attn
        out = sdpa(
            q, k, v, is_causal=q.shape[2] > 1, enable_gqa=attn.heads != attn.kv_heads, scale=attn.head_dim**-0.5
        )
        x = x + attn.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))
        return x + self.mlp(self.post_attention_layernorm(x))


class _Inner(nn.Module):
    """Holds `layers`, `norm`, `codec_embedding` under the checkpoint's `model.` prefix."""

    def __init__(self, s: DecoderConfig, num_code_groups: int, embed_dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Layer(s) for _ in range(s.num_layers))
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.codec_embedding = nn.ModuleList(nn.Embedding(s.vocab_size, embed_dim) for _ in range(num_code_groups - 1))


# (logits [B, V], group index) -> codes [B]
CodeSampler = Callable[[torch.Tensor, int], torch.Tensor]


class CodePredictor(nn.Module):
    """`embed_dim`: the width of its inputs and code embeddings (the talker's; default its own).
    When it differs from its own width (Qwen3-TTS 1.7B), `small_to_mtp_projection` maps every
    input row down, as the reference does; the embeddings stay at the talker's width."""

    def __init__(self, spec: DecoderConfig, num_code_groups: int, embed_dim: int | None = None) -> None:
        super().__init__()
        if spec.hidden_act != "silu":
            raise ValueError(f"code predictor hidden_act {spec.hidden_act!r} is not supported (silu only)")
        if num_code_groups < 2:
            raise ValueError(f"num_code_groups must be >= 2, got {num_code_groups}")
        self.spec, self.num_code_groups = spec, num_code_groups
        self.embed_dim = embed_dim or spec.hidden_size
        self.model = _Inner(spec, num_code_groups, self.embed_dim)
        self.lm_head = nn.ModuleList(
            nn.Linear(spec.hidden_size, spec.vocab_size, bias=False) for _ in range(num_code_groups - 1)
        )
        self.small_to_mtp_projection = (nn.Linear(self.embed_dim, spec.hidden_size, bias=True)
                                        if self.embed_dim != spec.hidden_size else None)
        self.inv_freq = rope_inv_freq(spec.head_dim, spec.rope_theta)  # float32 whatever the weights' dtype

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Input rows at `embed_dim` -> the predictor's width."""
        return x if self.small_to_mtp_projection is None else self.small_to_mtp_projection(x)

    @torch.no_grad()
    def predict(self, past_hidden: torch.Tensor, code0_embed: torch.Tensor, sample: CodeSampler) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes of groups 1..G-1 for a batch, and the embeddings of those codes.

        `past_hidden`, `code0_embed`: [B, H]. Returns codes [B, G-1] (int64) and
        embeddings [B, G-1, H] (`codec_embedding[g-1](code_g)`), which the talker sums
        into its next input.
        """
        groups = self.num_code_groups
        x = self.project(torch.stack((past_hidden, code0_embed), dim=1))
        caches: list[list[torch.Tensor]] = [[] for _ in self.model.layers]
        codes, embeds = [], []
        pos = 0
        for g in range(groups - 1):
            positions = torch.arange(pos, pos + x.shape[1], device=x.device)
            cos, sin = rope_cos_sin(self.inv_freq, positions, x.dtype)
            h = x
            for layer, cache in zip(self.model.layers, caches):
                h = layer(h, cos, sin, cache)
            pos += x.shape[1]
            logits = self.lm_head[g](self.model.norm(h[:, -1]))
            code = sample(logits, g + 1)
            codes.append(code)
            emb = self.model.codec_embedding[g](code)
            embeds.append(emb)
            x = self.project(emb[:, None])
        return torch.stack(codes, dim=1), torch.stack(embeds, dim=1)


def greedy_codes(logits: torch.Tensor, group: int) -> torch.Tensor:
    return torch.argmax(logits, dim=-1)


def predictor_rows(temperature: torch.Tensor, seed: torch.Tensor, counter: torch.Tensor,
                   top_k: int = PREDICTOR_TOP_K, top_p: float = PREDICTOR_TOP_P) -> RowParams:
    """The code predictor's per-row sampling, as transformers runs it when the talker samples
    (Qwen3-Omni: top-k 50, top-p 0.8; temperature 0 = a greedy row): [B] temperature, seed and draw counter."""
    k = torch.full_like(seed, top_k)
    p = torch.full_like(temperature, top_p)
    return RowParams(temperature, k, p, torch.zeros_like(temperature), seed, counter)


def sampled_codes(temperature: torch.Tensor, seed: torch.Tensor, frame: torch.Tensor, groups: int,
                  top_k: int = PREDICTOR_TOP_K, top_p: float = PREDICTOR_TOP_P) -> CodeSampler:
    """The `sample` callback of `predict`: group g of frame f draws with counter f * (groups-1) + g-1,
    so every code of a request has its own noise, batched or alone, eager or in a graph."""
    def sample(logits: torch.Tensor, group: int) -> torch.Tensor:
        counter = frame * (groups - 1) + (group - 1)
        return sample_rows(logits, predictor_rows(temperature, seed, counter, top_k, top_p), SampleMode.FILTER)

    return sample
