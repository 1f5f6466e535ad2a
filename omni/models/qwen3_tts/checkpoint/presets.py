"""Sizes of Qwen3-TTS checkpoints omni writes: two tiny ones that vary every shape omni must not
hard-code (widths, layers, heads, code groups, codebook, the code predictor's projection), and
the published 12Hz-1.7B sizes for the GPU benchmark (random weights, drawn at load)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    talker_layers: int
    talker_hidden: int
    talker_heads: int
    talker_kv_heads: int
    talker_head_dim: int
    talker_ffn: int
    mrope_section: tuple[int, int, int]  # sums to talker_head_dim / 2
    predictor_layers: int
    predictor_hidden: int  # != talker_hidden: the predictor projects (small_to_mtp_projection)
    predictor_heads: int
    predictor_kv_heads: int
    predictor_head_dim: int
    predictor_ffn: int
    num_code_groups: int
    codebook_size: int
    text_hidden: int
    speaker_channels: tuple[int, ...]  # speaker encoder TDNN channels (last: the aggregation)
    speaker_attention_channels: int
    speaker_res2net_scale: int
    speaker_se_channels: int
    rope_theta: float = 10000.0
    init_range: float = 0.3  # wide enough that greedy codes are not near-ties
    size: str = "1b7"


PRESETS: dict[str, Preset] = {
    "tiny-a": Preset(
        talker_layers=2, talker_hidden=32, talker_heads=4, talker_kv_heads=2, talker_head_dim=8, talker_ffn=64,
        mrope_section=(2, 1, 1), predictor_layers=1, predictor_hidden=32, predictor_heads=4,
        predictor_kv_heads=2, predictor_head_dim=8, predictor_ffn=48, num_code_groups=4, codebook_size=64,
        text_hidden=24, speaker_channels=(16, 16, 16, 16, 48), speaker_attention_channels=8,
        speaker_res2net_scale=4, speaker_se_channels=8,
    ),
    "tiny-b": Preset(
        talker_layers=3, talker_hidden=48, talker_heads=4, talker_kv_heads=1, talker_head_dim=12, talker_ffn=96,
        mrope_section=(2, 2, 2), predictor_layers=2, predictor_hidden=32, predictor_heads=4,
        predictor_kv_heads=2, predictor_head_dim=8, predictor_ffn=64, num_code_groups=8, codebook_size=128,
        text_hidden=40, speaker_channels=(24, 24, 24, 24, 72), speaker_attention_channels=8,
        speaker_res2net_scale=4, speaker_se_channels=12, rope_theta=1_000_000.0,
    ),
    # Qwen/Qwen3-TTS-12Hz-1.7B-{Base,CustomVoice,VoiceDesign}: the published config.json sizes
    "full-1.7b": Preset(
        talker_layers=28, talker_hidden=2048, talker_heads=16, talker_kv_heads=8, talker_head_dim=128,
        talker_ffn=6144, mrope_section=(24, 20, 20), predictor_layers=5, predictor_hidden=1024,
        predictor_heads=16, predictor_kv_heads=8, predictor_head_dim=128, predictor_ffn=3072,
        num_code_groups=16, codebook_size=2048, text_hidden=2048,
        speaker_channels=(512, 512, 512, 512, 1536), speaker_attention_channels=128, speaker_res2net_scale=8,
        speaker_se_channels=128, rope_theta=1_000_000.0, init_range=0.02,
    ),
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown Qwen3-TTS preset {name!r}; presets: {', '.join(PRESETS)}") from None
