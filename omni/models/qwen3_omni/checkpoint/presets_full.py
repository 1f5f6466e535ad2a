"""The published Qwen3-Omni-30B-A3B sizes as a config preset, and model directories that serve it
with random weights (no checkpoint on disk: every stage builds its part on the meta device and
draws bf16 weights directly on its own device, see `random_load`).

`transformers.Qwen3OmniMoeConfig()`'s class defaults are NOT these sizes (its thinker has 28
layers and a 3,584-token vocabulary). Sizes from REFERENCE-NOTES.md; keys the notes do not name
keep transformers' class defaults. Total 35.3B parameters (65.7 GiB in bf16); thinker decode
reads 6.08 GB of weights per token at batch 1 (non-expert weights, 8 of 128 experts, lm_head).

    python -m omni.models.qwen3_omni.checkpoint.presets_full DIR [--fp8]  # writes a random full-size model dir
    omnid serve --model DIR --set thinker.device=cuda ...  # every stage loads random weights
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from omni.layers.tokenizer_offline_full import build_tokenizer
from omni.models.loading import RANDOM_MARKER

PRESET = "qwen3-omni-30b-a3b"

_ROPE = {"rope_type": "default", "rope_theta": 1_000_000.0, "interleaved": True, "mrope_interleaved": True,
         "mrope_section": [24, 20, 20]}
_MM_IDS = {"audio_token_id": 151675, "image_token_id": 151655, "video_token_id": 151656,
           "vision_start_token_id": 151652, "audio_start_token_id": 151669}

FULL_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
    "model_type": "qwen3_omni_moe",
    "enable_audio_output": True,
    "im_start_token_id": 151644, "im_end_token_id": 151645,
    "tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
    "system_token_id": 8948, "user_token_id": 872, "assistant_token_id": 77091,
    "thinker_config": {
        **_MM_IDS,
        "user_token_id": 872,
        "position_id_per_seconds": 13,
        "text_config": {
            "vocab_size": 152064, "hidden_size": 2048, "intermediate_size": 768, "num_hidden_layers": 48,
            "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
            "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6,
            "max_position_embeddings": 65536, "tie_word_embeddings": False, "rope_parameters": dict(_ROPE),
        },
        "audio_config": {
            "num_mel_bins": 128, "encoder_layers": 32, "encoder_attention_heads": 20, "encoder_ffn_dim": 5120,
            "d_model": 1280, "output_dim": 2048, "downsample_hidden_size": 480, "max_source_positions": 1500,
            "n_window": 50, "n_window_infer": 800, "conv_chunksize": 500,
        },
        "vision_config": {
            "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "patch_size": 16,
            "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 2048,
            "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24],
        },
    },
    "talker_config": {
        **_MM_IDS,
        "num_code_groups": 16, "thinker_hidden_size": 2048, "accept_hidden_layer": 24,
        "codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156, "codec_think_eos_id": 2157,
        "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303},
        "spatial_merge_size": 2, "position_id_per_seconds": 13,
        "text_config": {
            "vocab_size": 3072, "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 20,
            "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128,
            "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 384,
            "shared_expert_intermediate_size": 768, "norm_topk_prob": False, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 65536, "rope_parameters": dict(_ROPE),
        },
        "code_predictor_config": {
            "vocab_size": 2048, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 5,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "num_code_groups": 16,
            "max_position_embeddings": 65536, "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
        },
    },
    "code2wav_config": {
        "codebook_size": 2048, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 8,
        "num_attention_heads": 16, "num_key_value_heads": 16, "sliding_window": 72, "num_quantizers": 16,
        "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "decoder_dim": 1536,
        "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
    },
}

PUBLISHED = {"total_params": 35.3e9, "bf16_gib": 65.7, "code2wav_params": 216e6, "thinker_active_bytes": 6.08e9}


def full_config() -> dict[str, Any]:
    """A fresh copy of the full-size config.json."""
    return copy.deepcopy(FULL_CONFIG)


def scaled_config(layers: int = 2, hidden: int = 64, experts: int = 8, top_k: int = 2) -> dict[str, Any]:
    """The same architecture and vocabulary (real token ids) at test sizes: every width and depth shrunk."""
    cfg = full_config()
    head = 16
    section = [head // 4, head // 8, head // 8]  # sums to head_dim / 2
    t = cfg["thinker_config"]
    t["text_config"].update(hidden_size=hidden, intermediate_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=head, num_experts=experts,
                            num_experts_per_tok=top_k, moe_intermediate_size=hidden // 2)
    t["text_config"]["rope_parameters"]["mrope_section"] = section
    t["audio_config"].update(encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, d_model=16,
                             output_dim=hidden, downsample_hidden_size=8)
    t["vision_config"].update(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=hidden,
                              num_position_embeddings=64, deepstack_visual_indexes=[0])
    k = cfg["talker_config"]
    k.update(thinker_hidden_size=hidden, accept_hidden_layer=min(layers, 1), num_code_groups=4)
    k["text_config"].update(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=head, num_experts=4, num_experts_per_tok=2,
                            moe_intermediate_size=16, shared_expert_intermediate_size=32)
    k["text_config"]["rope_parameters"]["mrope_section"] = section
    k["code_predictor_config"].update(hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=head, num_code_groups=4)
    cfg["code2wav_config"].update(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  num_key_value_heads=2, num_quantizers=4, decoder_dim=32, upsample_rates=[4, 3],
                                  upsampling_ratios=[2], sliding_window=8)
    return cfg


def thinker_active_bytes(cfg, bytes_per_param: int = 2) -> int:
    """Weight bytes one thinker decode token reads at batch 1 (the HBM roofline's numerator):
    attention, norms and routers of every layer, top_k of the experts, lm_head; the embedding
    table is not read whole (one row)."""
    t = cfg.text
    attn = t.hidden_size * t.head_dim * (2 * t.num_heads + 2 * t.num_kv_heads) + 2 * t.head_dim  # + q/k norms
    total = t.vocab_size * t.hidden_size + t.hidden_size  # lm_head, final norm
    for layer in range(t.num_layers):
        if t.is_moe_layer(layer):
            mlp = t.num_experts * t.hidden_size + t.num_experts_per_tok * 3 * t.hidden_size * t.moe_intermediate_size
        else:
            mlp = 3 * t.hidden_size * t.intermediate_size
        total += attn + 2 * t.hidden_size + mlp
    return total * bytes_per_param


def write_random_model_dir(out_dir: str | Path, config: dict[str, Any] | None = None, seed: int = 0,
                           fp8: bool = False) -> Path:
    """config.json (default: the full preset), a tokenizer with the real special ids, the
    preprocessor config, and `omni_random.json`, which makes every stage draw random weights.
    `fp8`: the config declares the published fine-grained FP8 format, so the thinker and talker
    draw bf16 weights and quantize them (e4m3, 128x128 block scales) on their device."""
    from omni.models.qwen3_omni.checkpoint.make_tiny import PREPROCESSOR_CONFIG

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    preset = PRESET if config is None else "custom"
    config = copy.deepcopy(config or full_config())
    if fp8:
        from omni.models.qwen3_omni.checkpoint.fp8_checkpoint import FORMAT

        config["quantization_config"] = FORMAT.to_config()
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    build_tokenizer().save_pretrained(str(out))
    pre = {**PREPROCESSOR_CONFIG, "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280}
    (out / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n")
    marker = {"random_weights": True, "load_format": "random", "seed": seed, **({"fp8": True} if fp8 else {}),
              "preset": preset}
    (out / RANDOM_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="write a random-weight Qwen3-Omni-30B-A3B model directory")
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scaled", action="store_true", help="test sizes instead of the full preset")
    ap.add_argument("--fp8", action="store_true", help="thinker and talker in fine-grained FP8 (quantized on device)")
    args = ap.parse_args(argv)
    path = write_random_model_dir(args.out_dir, scaled_config() if args.scaled else None, seed=args.seed, fp8=args.fp8)
    print(path, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
