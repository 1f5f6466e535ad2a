"""omni's own view of a Qwen3-Omni `config.json`: plain frozen dataclasses, read once.

Each part copies out only what its modules need; `raw` keeps the whole sub-dict for
anything rarer. Defaults mirror transformers' config classes, so a sparse config.json
(as the published one is) reads the same as it does in transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni.layers.configs import DecoderConfig, WaveDecoderConfig, read_decoder as _decoder, read_rope as _rope
from omni.layers.fp8_format import checkpoint_format
from omni.models.weights import CheckpointError

FAMILIES = {
    "Qwen3OmniMoeForConditionalGeneration": "qwen3_omni",
    "Qwen3OmniMoeThinkerForConditionalGeneration": "qwen3_omni",
}


@dataclass(frozen=True)
class AudioEncoderConfig:
    num_mel_bins: int
    num_layers: int
    num_heads: int
    ffn_dim: int
    d_model: int
    output_dim: int
    downsample_hidden_size: int
    max_source_positions: int
    n_window: int
    n_window_infer: int
    conv_chunksize: int
    activation: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class VisionEncoderConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    spatial_merge_size: int
    temporal_patch_size: int
    out_hidden_size: int
    num_position_embeddings: int
    deepstack_visual_indexes: tuple[int, ...]
    hidden_act: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class ThinkerConfig:
    text: DecoderConfig
    audio: AudioEncoderConfig
    vision: VisionEncoderConfig
    audio_token_id: int
    image_token_id: int
    video_token_id: int
    audio_start_token_id: int
    vision_start_token_id: int
    position_id_per_seconds: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class TalkerConfig:
    text: DecoderConfig
    code_predictor: DecoderConfig
    num_code_groups: int
    thinker_hidden_size: int
    accept_hidden_layer: int
    codec_pad_id: int
    codec_bos_id: int
    codec_eos_token_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    speaker_id: dict[str, int]
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Code2WavConfig(WaveDecoderConfig):
    """Qwen3-Omni's code2wav: the shared streaming decoder's fields, as `code2wav_config` gives them."""


@dataclass(frozen=True)
class Qwen3OmniConfig:
    thinker: ThinkerConfig
    talker: TalkerConfig | None  # None when the checkpoint has no audio output
    code2wav: Code2WavConfig | None
    im_start_token_id: int
    im_end_token_id: int
    tts_pad_token_id: int
    tts_bos_token_id: int
    tts_eos_token_id: int
    system_token_id: int
    user_token_id: int
    assistant_token_id: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def read_config_json(ckpt_dir: str | Path) -> dict[str, Any]:
    path = Path(ckpt_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc


def detect_family(ckpt_dir: str | Path) -> str:
    """The model family of a checkpoint, from `architectures` in its config.json."""
    archs = read_config_json(ckpt_dir).get("architectures") or []
    for arch in archs:
        if arch in FAMILIES:
            return FAMILIES[arch]
    raise CheckpointError(f"{ckpt_dir}: no supported architecture in {archs}; known: {sorted(FAMILIES)}")


def load_config(ckpt_dir: str | Path) -> Qwen3OmniConfig:
    """Read a Qwen3-Omni checkpoint's config.json into omni's dataclasses; QuantizationError for a
    `quantization_config` (anywhere in it) omni cannot honour (`omni.layers.fp8_format`)."""
    raw = read_config_json(ckpt_dir)
    if "thinker_config" not in raw:
        raise CheckpointError(f"{ckpt_dir}/config.json has no thinker_config: not a Qwen3-Omni checkpoint")
    checkpoint_format(raw, f"{ckpt_dir}/config.json")  # a quantization omni cannot honour is refused here
    audio_out = raw.get("enable_audio_output", True) and "talker_config" in raw
    return Qwen3OmniConfig(
        thinker=_thinker(raw["thinker_config"]),
        talker=_talker(raw["talker_config"]) if audio_out else None,
        code2wav=_code2wav(raw.get("code2wav_config") or {}) if audio_out else None,
        im_start_token_id=raw.get("im_start_token_id", 151644),
        im_end_token_id=raw.get("im_end_token_id", 151645),
        tts_pad_token_id=raw.get("tts_pad_token_id", 151671),
        tts_bos_token_id=raw.get("tts_bos_token_id", 151672),
        tts_eos_token_id=raw.get("tts_eos_token_id", 151673),
        system_token_id=raw.get("system_token_id", 8948),
        user_token_id=raw.get("user_token_id", 872),
        assistant_token_id=raw.get("assistant_token_id", 77091),
        raw=raw,
    )


# transformers' class defaults (what a key absent from config.json means)
_THINKER_TEXT = dict(vocab_size=3584, hidden_size=2048, intermediate_size=18944, num_hidden_layers=28,
                     num_attention_heads=28, num_key_value_heads=4, num_experts=128, num_experts_per_tok=8,
                     moe_intermediate_size=768, norm_topk_prob=True)
_TALKER_TEXT = dict(vocab_size=3072, hidden_size=1024, intermediate_size=2048, num_hidden_layers=20,
                    num_attention_heads=16, num_key_value_heads=2, num_experts=128, num_experts_per_tok=8,
                    moe_intermediate_size=384, norm_topk_prob=False)
_PREDICTOR = dict(vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, num_experts=0)


def _thinker(d: dict[str, Any]) -> ThinkerConfig:
    a, v = d.get("audio_config") or {}, d.get("vision_config") or {}
    return ThinkerConfig(
        text=_decoder(d.get("text_config") or {}, _THINKER_TEXT),
        audio=AudioEncoderConfig(
            num_mel_bins=a.get("num_mel_bins", 128),
            num_layers=a.get("encoder_layers", 32),
            num_heads=a.get("encoder_attention_heads", 20),
            ffn_dim=a.get("encoder_ffn_dim", 5120),
            d_model=a.get("d_model", 1280),
            output_dim=a.get("output_dim", 3584),
            downsample_hidden_size=a.get("downsample_hidden_size", 480),
            max_source_positions=a.get("max_source_positions", 1500),
            n_window=a.get("n_window", 50),
            n_window_infer=a.get("n_window_infer", 800),
            conv_chunksize=a.get("conv_chunksize", 500),
            activation=a.get("activation_function", "gelu"),
            raw=a,
        ),
        vision=VisionEncoderConfig(
            depth=v.get("depth", 27),
            hidden_size=v.get("hidden_size", 1152),
            intermediate_size=v.get("intermediate_size", 4304),
            num_heads=v.get("num_heads", 16),
            in_channels=v.get("in_channels", 3),
            patch_size=v.get("patch_size", 16),
            spatial_merge_size=v.get("spatial_merge_size", 2),
            temporal_patch_size=v.get("temporal_patch_size", 2),
            out_hidden_size=v.get("out_hidden_size", 3584),
            num_position_embeddings=v.get("num_position_embeddings", 2304),
            deepstack_visual_indexes=tuple(v.get("deepstack_visual_indexes", (8, 16, 24))),
            hidden_act=v.get("hidden_act", "gelu_pytorch_tanh"),
            raw=v,
        ),
        audio_token_id=d.get("audio_token_id", 151646),
        image_token_id=d.get("image_token_id", 151655),
        video_token_id=d.get("video_token_id", 151656),
        audio_start_token_id=d.get("audio_start_token_id", 151647),
        vision_start_token_id=d.get("vision_start_token_id", 151652),
        position_id_per_seconds=d.get("position_id_per_seconds", 25),
        raw=d,
    )


def _talker(d: dict[str, Any]) -> TalkerConfig:
    speakers = d.get("speaker_id") or {}
    if not isinstance(speakers, dict):
        raise CheckpointError(f"talker_config.speaker_id must be a dict, got {type(speakers).__name__}")
    groups = d.get("num_code_groups", 32)
    return TalkerConfig(
        text=_decoder(d.get("text_config") or {}, _TALKER_TEXT),
        code_predictor=_decoder(d.get("code_predictor_config") or {}, _PREDICTOR),
        num_code_groups=groups,
        thinker_hidden_size=d.get("thinker_hidden_size", 2048),
        accept_hidden_layer=d.get("accept_hidden_layer", 18),
        codec_pad_id=d.get("codec_pad_id", 4196),
        codec_bos_id=d.get("codec_bos_id", 4197),
        codec_eos_token_id=d.get("codec_eos_token_id", 4198),
        codec_nothink_id=d.get("codec_nothink_id", 4203),
        codec_think_bos_id=d.get("codec_think_bos_id", 4204),
        codec_think_eos_id=d.get("codec_think_eos_id", 4205),
        speaker_id={k.lower(): int(v) for k, v in speakers.items()},
        raw=d,
    )


def _code2wav(d: dict[str, Any]) -> Code2WavConfig:
    heads = d.get("num_attention_heads", 16)
    hidden = d.get("hidden_size", 1024)
    theta, _, _ = _rope(d, 10_000.0)
    return Code2WavConfig(
        codebook_size=d.get("codebook_size", 2048),
        hidden_size=hidden,
        intermediate_size=d.get("intermediate_size", 3072),
        num_layers=d.get("num_hidden_layers", 8),
        num_heads=heads,
        num_kv_heads=d.get("num_key_value_heads", 16),
        head_dim=d.get("head_dim") or hidden // heads,
        sliding_window=d.get("sliding_window", 72),
        rms_norm_eps=d.get("rms_norm_eps", 1e-5),
        rope_theta=theta,
        layer_scale_initial_scale=d.get("layer_scale_initial_scale", 0.01),
        num_quantizers=d.get("num_quantizers", 16),
        upsample_rates=tuple(d.get("upsample_rates", (8, 5, 4, 3))),
        upsampling_ratios=tuple(d.get("upsampling_ratios", (2, 2))),
        decoder_dim=d.get("decoder_dim", 1536),
    )
