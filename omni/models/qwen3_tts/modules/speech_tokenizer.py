"""The 12 Hz speech tokenizer's `speech_tokenizer/config.json` (`Qwen3TTSTokenizerV2Config` of the
reference), read into omni's own configs: the decoder (codes -> 24 kHz) and the Mimi encoder
(24 kHz -> codes). Defaults mirror the reference's config classes (and transformers' MimiConfig),
so a sparse config.json reads as it does there.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni.layers.configs import WaveDecoderConfig
from omni.models.weights import CheckpointError

MODEL_TYPE = "qwen3_tts_tokenizer_12hz"
TOKENIZER_DIR = "speech_tokenizer"  # inside a Qwen3-TTS checkpoint

_DECODER = dict(codebook_size=2048, hidden_size=1024, latent_dim=1024, max_position_embeddings=8000,
                rope_theta=10000.0, num_attention_heads=16, num_key_value_heads=16, attention_bias=False,
                sliding_window=72, intermediate_size=3072, layer_scale_initial_scale=0.01, rms_norm_eps=1e-5,
                num_hidden_layers=8, num_quantizers=16, upsample_rates=(8, 5, 4, 3), upsampling_ratios=(2, 2),
                decoder_dim=1536)
_ENCODER = dict(sampling_rate=24000, audio_channels=1, hidden_size=512, num_filters=64, num_residual_layers=1,
                upsampling_ratios=(8, 6, 5, 4), kernel_size=7, last_kernel_size=3, residual_kernel_size=3,
                dilation_growth_rate=2, use_causal_conv=True, pad_mode="constant", compress=2,
                codebook_size=2048, codebook_dim=256, num_quantizers=32, use_conv_shortcut=False,
                vector_quantization_hidden_dimension=256, num_semantic_quantizers=1, num_hidden_layers=8,
                intermediate_size=2048, num_attention_heads=8, num_key_value_heads=8, head_dim=None,
                hidden_act="gelu", max_position_embeddings=8000, norm_eps=1e-5, rope_theta=10000.0,
                layer_scale_initial_scale=0.01, attention_bias=False, frame_rate=None)


@dataclass(frozen=True)
class DecoderConfig(WaveDecoderConfig):
    """The shared streaming decoder's config (omni.layers.codec reads it) plus the 12 Hz decoder's
    own widths."""

    codebook_dim: int = 0  # the RVQ output width (pre_conv's input)
    latent_dim: int = 0  # the convolutional width between pre_conv and the waveform decoder
    attention_bias: bool = False


@dataclass(frozen=True)
class EncoderConfig:
    """transformers' MimiConfig fields the encode path uses (SEANet, transformer, downsample, RVQ)."""

    sampling_rate: int
    audio_channels: int
    hidden_size: int
    num_filters: int
    num_residual_layers: int
    upsampling_ratios: tuple[int, ...]
    kernel_size: int
    last_kernel_size: int
    residual_kernel_size: int
    dilation_growth_rate: int
    pad_mode: str
    compress: int
    codebook_size: int
    codebook_dim: int
    num_quantizers: int
    use_conv_shortcut: bool
    vector_quantization_hidden_dimension: int
    num_semantic_quantizers: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str
    norm_eps: float
    rope_theta: float
    layer_scale_initial_scale: float
    attention_bias: bool
    latent_stride: int  # the downsample conv's stride (SEANet rate -> frame rate)

    @property
    def hop(self) -> int:
        """Input samples per code frame."""
        return math.prod(self.upsampling_ratios) * self.latent_stride


@dataclass(frozen=True)
class SpeechTokenizerConfig:
    decoder: DecoderConfig
    encoder: EncoderConfig
    valid_quantizers: int  # codes per frame the encoder keeps (= the decoder's num_quantizers)
    input_sample_rate: int
    output_sample_rate: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def load_tokenizer_config(tokenizer_dir: str | Path) -> SpeechTokenizerConfig:
    path = Path(tokenizer_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{tokenizer_dir} has no config.json (a Qwen3-TTS speech_tokenizer folder)")
    try:
        d = json.loads(path.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    return parse_tokenizer_config(d)


def parse_tokenizer_config(d: dict[str, Any]) -> SpeechTokenizerConfig:
    if d.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise CheckpointError(f"speech tokenizer model_type {d.get('model_type')!r}: omni serves {MODEL_TYPE} only")
    dec = {**_DECODER, **(d.get("decoder_config") or {})}
    if "codebook_dim" not in dec:
        raise CheckpointError("speech tokenizer decoder_config has no codebook_dim")
    if (dec.get("rope_scaling") or {}).get("rope_type", "default") not in ("default", None):
        raise CheckpointError(f"speech tokenizer decoder rope_scaling {dec['rope_scaling']} is not served")
    heads = int(dec["num_attention_heads"])
    decoder = DecoderConfig(
        codebook_size=int(dec["codebook_size"]), codebook_dim=int(dec["codebook_dim"]),
        latent_dim=int(dec["latent_dim"]), hidden_size=int(dec["hidden_size"]),
        intermediate_size=int(dec["intermediate_size"]), num_layers=int(dec["num_hidden_layers"]),
        num_heads=heads, num_kv_heads=int(dec["num_key_value_heads"]),
        head_dim=int(dec.get("head_dim") or int(dec["hidden_size"]) // heads),
        attention_bias=bool(dec["attention_bias"]), sliding_window=int(dec["sliding_window"]),
        rms_norm_eps=float(dec["rms_norm_eps"]), rope_theta=float(dec["rope_theta"]),
        layer_scale_initial_scale=float(dec["layer_scale_initial_scale"]),
        num_quantizers=int(dec["num_quantizers"]), upsample_rates=tuple(int(r) for r in dec["upsample_rates"]),
        upsampling_ratios=tuple(int(r) for r in dec["upsampling_ratios"]), decoder_dim=int(dec["decoder_dim"]),
        sample_rate=int(d.get("output_sample_rate", 24000)),
    )
    enc = {**_ENCODER, **(d.get("encoder_config") or {})}
    rope = enc.get("rope_parameters") or {}
    theta = float(rope.get("rope_theta", enc["rope_theta"]))
    if not enc["use_causal_conv"]:
        raise CheckpointError("speech tokenizer encoder: only causal convolutions are served")
    ratios = tuple(int(r) for r in enc["upsampling_ratios"])
    hop = math.prod(ratios)
    frame_rate = enc["frame_rate"] or (int(enc["sampling_rate"]) / (hop * 2))
    encodec_rate = math.ceil(int(enc["sampling_rate"]) / hop)
    e_heads = int(enc["num_attention_heads"])
    encoder = EncoderConfig(
        sampling_rate=int(enc["sampling_rate"]), audio_channels=int(enc["audio_channels"]),
        hidden_size=int(enc["hidden_size"]), num_filters=int(enc["num_filters"]),
        num_residual_layers=int(enc["num_residual_layers"]), upsampling_ratios=ratios,
        kernel_size=int(enc["kernel_size"]), last_kernel_size=int(enc["last_kernel_size"]),
        residual_kernel_size=int(enc["residual_kernel_size"]), dilation_growth_rate=int(enc["dilation_growth_rate"]),
        pad_mode=str(enc["pad_mode"]), compress=int(enc["compress"]), codebook_size=int(enc["codebook_size"]),
        codebook_dim=int(enc["codebook_dim"] or enc["hidden_size"]), num_quantizers=int(enc["num_quantizers"]),
        use_conv_shortcut=bool(enc["use_conv_shortcut"]),
        vector_quantization_hidden_dimension=int(enc["vector_quantization_hidden_dimension"]),
        num_semantic_quantizers=int(enc["num_semantic_quantizers"]), num_hidden_layers=int(enc["num_hidden_layers"]),
        intermediate_size=int(enc["intermediate_size"]), num_attention_heads=e_heads,
        num_key_value_heads=int(enc["num_key_value_heads"]),
        head_dim=int(enc["head_dim"] or int(enc["hidden_size"]) // e_heads), hidden_act=str(enc["hidden_act"]),
        norm_eps=float(enc["norm_eps"]), rope_theta=theta,
        layer_scale_initial_scale=float(enc["layer_scale_initial_scale"]), attention_bias=bool(enc["attention_bias"]),
        latent_stride=int(encodec_rate / frame_rate),
    )
    valid = int(d.get("encoder_valid_num_quantizers", 16))
    if valid != decoder.num_quantizers or valid > encoder.num_quantizers:
        raise CheckpointError(f"speech tokenizer: encoder_valid_num_quantizers {valid} must equal the decoder's "
                              f"num_quantizers {decoder.num_quantizers} and fit the encoder's {encoder.num_quantizers}")
    if encoder.hop != decoder.total_upsample:
        raise CheckpointError(f"speech tokenizer: encoder hop {encoder.hop} != decoder upsampling "
                              f"{decoder.total_upsample}")
    return SpeechTokenizerConfig(decoder, encoder, valid, int(d.get("input_sample_rate", 24000)),
                                 int(d.get("output_sample_rate", 24000)), raw=d)
