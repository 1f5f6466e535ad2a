"""Write a random-weight 12 Hz speech tokenizer folder (`speech_tokenizer/`) in the published
layout: config.json (`Qwen3TTSTokenizerV2Config`), preprocessor_config.json (Mimi's feature
extractor) and model.safetensors with Mimi's flat encoder names (`encoder.encoder.layers.*`,
`encoder.encoder_transformer.*`, `encoder.downsample.*`, `encoder.quantizer.*`) and the decoder's
(`decoder.*`). omni and the reference both load it.

Presets: "tiny-a" and "tiny-b" vary every width, depth, head count, window and rate order omni
must not hard-code; "full-1.7b" is the published 12Hz tokenizer's sizes (about 0.7 GB of float32,
so that the reference loads it too in the benchmark). A folder with the config but no weights
still serves: omni's stages draw the weights at load (modules/random_init.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from omni.models.qwen3_tts.modules.random_init import init_decoder_, init_encoder_
from omni.models.qwen3_tts.modules.speech_tokenizer import MODEL_TYPE, parse_tokenizer_config

PRESETS: dict[str, dict] = {
    "tiny-a": dict(
        decoder=dict(hidden_size=16, latent_dim=24, codebook_dim=16, decoder_dim=32, intermediate_size=32,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                     sliding_window=6, upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2]),
        encoder=dict(hidden_size=32, num_filters=4, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4, head_dim=8, codebook_dim=8,
                     vector_quantization_hidden_dimension=8, upsampling_ratios=[8, 6, 5, 4], extra_quantizers=2,
                     upsample_groups=32),
    ),
    "tiny-b": dict(
        decoder=dict(hidden_size=24, latent_dim=16, codebook_dim=24, decoder_dim=48, intermediate_size=40,
                     num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                     sliding_window=4, upsample_rates=[5, 8, 3, 4], upsampling_ratios=[4], attention_bias=True),
        encoder=dict(hidden_size=24, num_filters=2, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=12, codebook_dim=24,
                     vector_quantization_hidden_dimension=24, upsampling_ratios=[6, 8, 4, 5], extra_quantizers=0,
                     upsample_groups=24),
    ),
    # Qwen/Qwen3-TTS-Tokenizer-12Hz as published
    "full-1.7b": dict(
        decoder=dict(hidden_size=512, latent_dim=1024, codebook_dim=512, decoder_dim=1536, intermediate_size=1024,
                     num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16, head_dim=64,
                     sliding_window=72, upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2]),
        encoder=dict(hidden_size=512, num_filters=64, intermediate_size=2048, num_hidden_layers=8,
                     num_attention_heads=8, num_key_value_heads=8, head_dim=64, codebook_dim=256,
                     vector_quantization_hidden_dimension=256, upsampling_ratios=[8, 6, 5, 4], extra_quantizers=None,
                     upsample_groups=512),
    ),
}
FEATURE_EXTRACTOR = {"feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1, "padding_side": "right",
                     "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": 24000,
                     "chunk_length_s": None, "overlap": None}


def tokenizer_config(preset: str, num_quantizers: int, codebook_size: int) -> dict:
    """The config.json of `preset` for a talker of `num_quantizers` code groups of `codebook_size`."""
    if preset not in PRESETS:
        raise ValueError(f"unknown speech tokenizer preset {preset!r}; presets: {', '.join(PRESETS)}")
    p = PRESETS[preset]
    decoder = {**p["decoder"], "codebook_size": codebook_size, "num_quantizers": num_quantizers,
               "attention_dropout": 0.0, "hidden_act": "silu", "layer_scale_initial_scale": 0.01,
               "max_position_embeddings": 8000, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
    decoder.setdefault("attention_bias", False)
    enc = dict(p["encoder"])
    extra = enc.pop("extra_quantizers")
    total = 32 if extra is None else num_quantizers + extra
    encoder = {**enc, "audio_channels": 1, "codebook_size": codebook_size, "compress": 2, "dilation_growth_rate": 2,
               "frame_rate": 12.5, "hidden_act": "gelu", "kernel_size": 7, "last_kernel_size": 3,
               "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000, "norm_eps": 1e-5,
               "num_quantizers": total, "num_residual_layers": 1, "num_semantic_quantizers": 1, "pad_mode": "constant",
               "residual_kernel_size": 3, "rope_theta": 10000.0, "sampling_rate": 24000, "sliding_window": 250,
               "trim_right_ratio": 1.0, "use_causal_conv": True, "use_conv_shortcut": False, "use_cache": False}
    hop = math.prod(decoder["upsample_rates"] + decoder["upsampling_ratios"])
    return {"architectures": ["Qwen3TTSTokenizerV2Model"], "model_type": MODEL_TYPE,
            "encoder_valid_num_quantizers": num_quantizers, "input_sample_rate": 24000, "output_sample_rate": 24000,
            "decode_upsample_rate": hop, "encode_downsample_rate": hop,
            "decoder_config": decoder, "encoder_config": encoder}


def write_tiny_tokenizer(out_dir: Path, *, num_quantizers: int, codebook_size: int, preset: str, seed: int) -> None:
    """Write `out_dir` (the checkpoint's speech_tokenizer/ folder)."""
    from safetensors.torch import save_file

    from omni.models.qwen3_tts.modules.speech_tokenizer_decoder import SpeechTokenizerDecoder
    from omni.models.qwen3_tts.modules.speech_tokenizer_encoder import ResidualVQ, SpeechTokenizerEncoder

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = tokenizer_config(preset, num_quantizers, codebook_size)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "preprocessor_config.json").write_text(json.dumps(FEATURE_EXTRACTOR, indent=2))
    cfg = parse_tokenizer_config(config)
    decoder = SpeechTokenizerDecoder(cfg.decoder)
    init_decoder_(decoder, seed)
    # every codebook the checkpoint has (the encoder keeps the first Q), plus the decode-side projections
    encoder = SpeechTokenizerEncoder(cfg.encoder, cfg.encoder.num_quantizers)
    init_encoder_(encoder, seed)
    tensors = {f"decoder.{k}": v for k, v in decoder.state_dict().items()}
    tensors.update({f"encoder.{k}": v for k, v in encoder.state_dict().items()})
    gen = torch.Generator().manual_seed(int(seed) + 2)
    for half in ("semantic", "acoustic"):
        rvq: ResidualVQ = getattr(encoder.quantizer, f"{half}_residual_vector_quantizer")
        if rvq.input_proj is not None:
            w = rvq.input_proj.weight
            tensors[f"encoder.quantizer.{half}_residual_vector_quantizer.output_proj.weight"] = (
                torch.randn((w.shape[1], w.shape[0], 1), generator=gen) / math.sqrt(w.shape[0]))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "model.safetensors"))
