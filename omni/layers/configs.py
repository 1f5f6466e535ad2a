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
