"""Sizes of the tiny random Qwen3-Omni checkpoints; each preset changes the shapes that
omni's code must not hard-code (layers, widths, experts, code groups, codebook, upsampling)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TinyPreset:
    thinker_layers: int
    thinker_hidden: int
    thinker_heads: int
    thinker_kv_heads: int
    thinker_experts: int
    thinker_top_k: int
    thinker_moe_ffn: int
    mrope_section: tuple[int, int, int]  # sums to head_dim / 2
    deepstack_indexes: tuple[int, ...]
    audio_layers: int
    audio_d_model: int
    audio_heads: int
    vision_depth: int
    vision_hidden: int
    vision_heads: int
    talker_layers: int
    talker_hidden: int
    talker_heads: int
    talker_kv_heads: int
    talker_experts: int
    talker_top_k: int
    talker_mrope_section: tuple[int, int, int]
    accept_hidden_layer: int
    predictor_layers: int
    num_code_groups: int
    codebook_size: int
    c2w_hidden: int
    c2w_layers: int
    c2w_heads: int
    c2w_window: int
    c2w_decoder_dim: int
    upsample_rates: tuple[int, ...]
    upsampling_ratios: tuple[int, ...]
    init_range: float = 0.3
    # code2wav's deep conv stack saturates (clamps at +-1) above ~0.1; this keeps the peak ~0.1-0.5
    c2w_init_range: float = 0.08


PRESETS: dict[str, TinyPreset] = {
    "tiny-a": TinyPreset(
        thinker_layers=2, thinker_hidden=32, thinker_heads=4, thinker_kv_heads=2,
        thinker_experts=4, thinker_top_k=2, thinker_moe_ffn=16, mrope_section=(2, 1, 1),
        deepstack_indexes=(0,),
        audio_layers=2, audio_d_model=16, audio_heads=2,
        vision_depth=2, vision_hidden=16, vision_heads=2,
        talker_layers=2, talker_hidden=32, talker_heads=4, talker_kv_heads=2,
        talker_experts=4, talker_top_k=2, talker_mrope_section=(2, 1, 1),
        accept_hidden_layer=1, predictor_layers=1,
        num_code_groups=4, codebook_size=64,
        c2w_hidden=32, c2w_layers=2, c2w_heads=4, c2w_window=8, c2w_decoder_dim=32,
        upsample_rates=(4, 3), upsampling_ratios=(2,),
    ),
    "tiny-b": TinyPreset(
        thinker_layers=3, thinker_hidden=48, thinker_heads=4, thinker_kv_heads=1,
        thinker_experts=8, thinker_top_k=2, thinker_moe_ffn=24, mrope_section=(2, 2, 2),
        deepstack_indexes=(0, 1),
        audio_layers=1, audio_d_model=24, audio_heads=3,
        vision_depth=3, vision_hidden=24, vision_heads=3,
        talker_layers=3, talker_hidden=48, talker_heads=4, talker_kv_heads=2,
        talker_experts=6, talker_top_k=2, talker_mrope_section=(2, 2, 2),
        accept_hidden_layer=2, predictor_layers=2,
        num_code_groups=8, codebook_size=128,
        c2w_hidden=24, c2w_layers=3, c2w_heads=2, c2w_window=6, c2w_decoder_dim=32,
        upsample_rates=(5, 4), upsampling_ratios=(2, 2), c2w_init_range=0.085,
    ),
    "tiny-c": TinyPreset(
        thinker_layers=4, thinker_hidden=64, thinker_heads=4, thinker_kv_heads=2,
        thinker_experts=6, thinker_top_k=3, thinker_moe_ffn=16, mrope_section=(4, 2, 2),
        deepstack_indexes=(0, 1, 2),
        audio_layers=2, audio_d_model=32, audio_heads=4,
        vision_depth=3, vision_hidden=32, vision_heads=4,
        talker_layers=2, talker_hidden=32, talker_heads=2, talker_kv_heads=1,
        talker_experts=4, talker_top_k=1, talker_mrope_section=(4, 2, 2),
        accept_hidden_layer=3, predictor_layers=1,
        num_code_groups=16, codebook_size=32,
        c2w_hidden=32, c2w_layers=2, c2w_heads=4, c2w_window=12, c2w_decoder_dim=64,
        upsample_rates=(8, 5, 4, 3), upsampling_ratios=(2, 2), c2w_init_range=0.085,
    ),
    # head_dim 64 and wider MoE blocks: the shapes SGLang's attention and fused-MoE kernels are tuned for
    "tiny-d": TinyPreset(
        thinker_layers=4, thinker_hidden=128, thinker_heads=2, thinker_kv_heads=1,
        thinker_experts=8, thinker_top_k=2, thinker_moe_ffn=64, mrope_section=(16, 8, 8),
        deepstack_indexes=(0,),
        audio_layers=1, audio_d_model=16, audio_heads=2,
        vision_depth=1, vision_hidden=16, vision_heads=2,
        talker_layers=2, talker_hidden=32, talker_heads=4, talker_kv_heads=2,
        talker_experts=4, talker_top_k=2, talker_mrope_section=(2, 1, 1),
        accept_hidden_layer=2, predictor_layers=1,
        num_code_groups=4, codebook_size=64,
        c2w_hidden=32, c2w_layers=2, c2w_heads=4, c2w_window=8, c2w_decoder_dim=32,
        upsample_rates=(4, 3), upsampling_ratios=(2,),
    ),
}


def get_preset(name: str) -> TinyPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown tiny preset {name!r}; known: {sorted(PRESETS)}") from None
