"""The config dataclasses that shared blocks read, so a family's config parser can fill them and
every family's modules take the same type.

`DecoderConfig` describes a (MoE) transformer decoder (a thinker's text model, a talker, a code
predictor); `WaveDecoderConfig` the streaming codec decoder of `omni.layers.codec` (codes ->
PCM). Each family reads its own config.json into these; `raw` keeps the whole sub-dict for anything
rarer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DecoderConfig:
    """A (MoE) transformer decoder: the thinker's text model, the talker, the code predictor."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    mrope_section: tuple[int, ...]  # empty for plain 1-D rope
    mrope_interleaved: bool
    max_position_embeddings: int
    num_experts: int = 0  # 0: dense MLP everywhere
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    shared_expert_intermediate_size: int = 0
    hidden_act: str = "silu"
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def is_moe_layer(self, layer: int) -> bool:
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )


@dataclass(frozen=True)
class WaveDecoderConfig:
    """The streaming codec decoder's sizes: sliding-window pre-transformer, upsampling, SEANet decoder."""

    codebook_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int
    rms_norm_eps: float
    rope_theta: float
    layer_scale_initial_scale: float
    num_quantizers: int
    upsample_rates: tuple[int, ...]
    upsampling_ratios: tuple[int, ...]
    decoder_dim: int
    sample_rate: int = 24000

    @property
    def total_upsample(self) -> int:
        """Waveform samples per codec frame."""
        n = 1
        for r in self.upsample_rates + self.upsampling_ratios:
            n *= r
        return n


def read_rope(d: dict[str, Any], default_theta: float) -> tuple[float, tuple[int, ...], bool]:
    """(theta, mrope_section, interleaved) of a config.json part, in either of transformers' layouts."""
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    theta = rope.get("rope_theta", d.get("rope_theta", default_theta))
    section = tuple(rope.get("mrope_section") or ())
    return float(theta), section, bool(rope.get("mrope_interleaved", rope.get("interleaved", False)))


def read_decoder(d: dict[str, Any], defaults: dict[str, Any]) -> DecoderConfig:
    """A transformers text config dict as a DecoderConfig; `defaults`: its class's defaults (what a
    key absent from config.json means)."""
    merged = {**defaults, **d}
    if "num_local_experts" in d:
        merged.pop("num_experts", None)
    g = merged.get
    heads = g("num_attention_heads")
    theta, section, interleaved = read_rope(d, defaults.get("rope_theta", 1_000_000.0))
    return DecoderConfig(
        vocab_size=g("vocab_size"),
        hidden_size=g("hidden_size"),
        intermediate_size=g("intermediate_size"),
        num_layers=g("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=g("num_key_value_heads") or heads,
        head_dim=g("head_dim") or g("hidden_size") // heads,
        rms_norm_eps=g("rms_norm_eps", 1e-6),
        rope_theta=theta,
        mrope_section=section,
        mrope_interleaved=interleaved,
        max_position_embeddings=g("max_position_embeddings", 32768),
        num_experts=g("num_local_experts") or g("num_experts", 0) or 0,  # the talker saves the alias
        num_experts_per_tok=g("num_experts_per_tok", 0) or 0,
        moe_intermediate_size=g("moe_intermediate_size", 0) or 0,
        norm_topk_prob=g("norm_topk_prob", True),
        decoder_sparse_step=g("decoder_sparse_step", 1) or 1,
        mlp_only_layers=tuple(g("mlp_only_layers") or ()),
        shared_expert_intermediate_size=g("shared_expert_intermediate_size", 0) or 0,
        hidden_act=g("hidden_act", "silu"),
        raw=d,
    )
