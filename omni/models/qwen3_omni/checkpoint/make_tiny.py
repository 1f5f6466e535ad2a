"""Tiny random-weight checkpoints of the real Qwen3-Omni architecture, built with transformers.

Tests load them in both transformers (the oracle) and omni. Every cross-part constraint of the
architecture is honoured here (see REFERENCE-NOTES.md): talker vocab = codebook + 1024, codec
special ids inside that top 1024, code groups = code2wav quantizers, speaker ids as a dict,
`spatial_merge_size` / `shared_expert_intermediate_size` passed explicitly, mrope sections
summing to head_dim / 2, and an init range wide enough that greedy outputs are not near-ties.
transformers leaves the talker's routed experts uninitialised (`torch.empty`), so they are filled
here from a generator seeded by `seed`: the same seed always gives the same bytes. A marker file,
`omni_tiny.json`, says the weights are random (omni then says so when serving them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from omni.help_format import DefaultsHelp
from omni.models.qwen3_omni.checkpoint.tiny_presets import PRESETS, TinyPreset, get_preset
from omni.layers.tokenizer_offline import save_tokenizer, token_ids, vocab_size

# Offsets of the codec special ids above the codebook, as in the published config
# (codebook 2048: pad 2148, bos 2149, eos 2150, nothink 2155, think bos/eos 2156/2157,
# speakers 2301..2303).
CODEC_OFFSETS = {
    "codec_pad_id": 100,
    "codec_bos_id": 101,
    "codec_eos_token_id": 102,
    "codec_nothink_id": 107,
    "codec_think_bos_id": 108,
    "codec_think_eos_id": 109,
}
SPEAKER_OFFSETS = {"chelsie": 253, "ethan": 254, "aiden": 255}

# The published layout of preprocessor_config.json, with a small pixel budget
# (4..64 patches of 16x16 per image or video frame) so tiny tests stay fast.
TINY_MARKER = "omni_tiny.json"

PREPROCESSOR_CONFIG = {
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "sampling_rate": 16000,
    "hop_length": 160,
    "n_fft": 400,
    "chunk_length": 30,
    "padding_value": 0.0,
    "return_attention_mask": True,
    "dither": 0.0,
    "image_processor_type": "Qwen2VLImageProcessor",
    "patch_size": 16,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "min_pixels": 32 * 32,
    "max_pixels": 128 * 128,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    # the video processor's (omni reads these; transformers' Qwen3-Omni processor defaults to
    # 128..768 x 32 x 32 pixels per frame and is called with fps=2): a small budget here too
    "video_min_pixels": 32 * 32,
    "video_max_pixels": 128 * 128,
    "video_fps": 2.0,
    "processor_class": "Qwen3OmniMoeProcessor",
}


def build_config(preset: TinyPreset):
    """The `Qwen3OmniMoeConfig` of a preset (not saved)."""
    from transformers import Qwen3OmniMoeConfig

    p, ids, init = preset, token_ids(), preset.init_range
    thinker_head_dim = p.thinker_hidden // p.thinker_heads
    talker_head_dim = p.talker_hidden // p.talker_heads
    _check(sum(p.mrope_section) * 2 == thinker_head_dim, "thinker mrope_section must sum to head_dim/2")
    _check(sum(p.talker_mrope_section) * 2 == talker_head_dim, "talker mrope_section must sum to head_dim/2")
    _check(p.accept_hidden_layer <= p.thinker_layers, "accept_hidden_layer > thinker layers")
    _check(max(p.deepstack_indexes) < min(p.vision_depth, p.thinker_layers), "deepstack index too deep")
    mm_ids = {
        "audio_token_id": ids["<|audio_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "audio_start_token_id": ids["<|audio_start|>"],
    }
    rope = {"rope_type": "default", "rope_theta": 1_000_000.0, "interleaved": True}
    thinker = {
        "text_config": {
            "vocab_size": vocab_size(),
            "hidden_size": p.thinker_hidden,
            "intermediate_size": 2 * p.thinker_hidden,
            "num_hidden_layers": p.thinker_layers,
            "num_attention_heads": p.thinker_heads,
            "num_key_value_heads": p.thinker_kv_heads,
            "num_experts": p.thinker_experts,
            "num_experts_per_tok": p.thinker_top_k,
            "moe_intermediate_size": p.thinker_moe_ffn,
            "max_position_embeddings": 4096,
            "rope_parameters": {**rope, "mrope_section": list(p.mrope_section), "mrope_interleaved": True},
            "initializer_range": init,
        },
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": p.audio_layers,
            "encoder_attention_heads": p.audio_heads,
            "encoder_ffn_dim": 2 * p.audio_d_model,
            "d_model": p.audio_d_model,
            "output_dim": p.thinker_hidden,
            "downsample_hidden_size": 8,
            "max_source_positions": 1500,
            "n_window": 50,
            "n_window_infer": 400,
            "initializer_range": init,
        },
        "vision_config": {
            "depth": p.vision_depth,
            "hidden_size": p.vision_hidden,
            "intermediate_size": 2 * p.vision_hidden,
            "num_heads": p.vision_heads,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": p.thinker_hidden,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": list(p.deepstack_indexes),
            "initializer_range": init,
        },
        **mm_ids,
        "user_token_id": ids["user"],
        "position_id_per_seconds": 13,
        "initializer_range": init,
    }
    vocab_talker = p.codebook_size + 1024
    codec_ids = {k: p.codebook_size + off for k, off in CODEC_OFFSETS.items()}
    talker = {
        "text_config": {
            "vocab_size": vocab_talker,
            "hidden_size": p.talker_hidden,
            "intermediate_size": 2 * p.talker_hidden,
            "num_hidden_layers": p.talker_layers,
            "num_attention_heads": p.talker_heads,
            "num_key_value_heads": p.talker_kv_heads,
            "num_experts": p.talker_experts,
            "num_experts_per_tok": p.talker_top_k,
            "moe_intermediate_size": p.talker_hidden // 2,
            "shared_expert_intermediate_size": p.talker_hidden,
            "max_position_embeddings": 4096,
            "rope_parameters": {**rope, "mrope_section": list(p.talker_mrope_section), "mrope_interleaved": True},
            "initializer_range": init,
        },
        "code_predictor_config": {
            "vocab_size": p.codebook_size,
            "hidden_size": p.talker_hidden,
            "intermediate_size": 2 * p.talker_hidden,
            "num_hidden_layers": p.predictor_layers,
            "num_attention_heads": p.talker_heads,
            "num_key_value_heads": p.talker_kv_heads,
            "head_dim": talker_head_dim,
            "max_position_embeddings": 4096,
            "num_code_groups": p.num_code_groups,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "initializer_range": init,
        },
        "num_code_groups": p.num_code_groups,
        "thinker_hidden_size": p.thinker_hidden,
        "accept_hidden_layer": p.accept_hidden_layer,
        **codec_ids,
        **mm_ids,
        "spatial_merge_size": 2,
        "position_id_per_seconds": 13,
        "speaker_id": {name: p.codebook_size + off for name, off in SPEAKER_OFFSETS.items()},
        "initializer_range": init,
    }
    code2wav = {
        "codebook_size": p.codebook_size,
        "hidden_size": p.c2w_hidden,
        "intermediate_size": 2 * p.c2w_hidden,
        "num_hidden_layers": p.c2w_layers,
        "num_attention_heads": p.c2w_heads,
        "num_key_value_heads": p.c2w_heads,
        "sliding_window": p.c2w_window,
        "max_position_embeddings": 8000,
        "num_quantizers": p.num_code_groups,
        "upsample_rates": list(p.upsample_rates),
        "upsampling_ratios": list(p.upsampling_ratios),
        "decoder_dim": p.c2w_decoder_dim,
        "layer_scale_initial_scale": 0.1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
        "initializer_range": p.c2w_init_range,
    }
    _check(p.c2w_decoder_dim // 2 ** len(p.upsample_rates) >= 1, "decoder_dim too small for upsample_rates")
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=code2wav,
        enable_audio_output=True,
        im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<|tts_pad|>"],
        tts_bos_token_id=ids["<|tts_bos|>"],
        tts_eos_token_id=ids["<|tts_eos|>"],
        system_token_id=ids["system"],
        user_token_id=ids["user"],
        assistant_token_id=ids["assistant"],
        initializer_range=init,
        architectures=["Qwen3OmniMoeForConditionalGeneration"],
    )


def make_tiny(out_dir: str | Path, seed: int = 0, preset: str = "tiny-a", fill_talker_router: bool = False,
              fp8: bool = False) -> Path:
    """Write a tiny random Qwen3-Omni checkpoint (config, safetensors, tokenizer) to `out_dir`.

    transformers leaves the talker's router all zeros, so every talker expert choice is an exact
    top-k tie, which CPU and CUDA break differently (CPU here picks other experts than CUDA's lowest
    index first): comparisons across devices need `fill_talker_router=True`. The default keeps the
    zero router because the CPU tests' reference prompts were chosen on those checkpoints. `fp8`: the
    thinker's and talker's decoder linears rewritten in the published fine-grained FP8 format
    (`fp8_checkpoint.write_fp8`)."""
    import torch
    from transformers import GenerationConfig, Qwen3OmniMoeForConditionalGeneration
    from transformers.utils import logging as hf_logging

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the published config's mrope keys trip a rope-key warning
    try:
        config = build_config(get_preset(preset))
    finally:
        hf_logging.set_verbosity(verbosity)
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    init_talker_experts(model, seed, get_preset(preset).init_range)
    if fill_talker_router:
        init_talker_router(model, seed, get_preset(preset).init_range)
    model.generation_config = GenerationConfig(eos_token_id=token_ids()["<|im_end|>"])
    model.save_pretrained(str(out), safe_serialization=True)
    save_tokenizer(out)
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2) + "\n")
    if fp8:
        from omni.models.qwen3_omni.checkpoint.fp8_checkpoint import write_fp8

        write_fp8(out)
    marker = {"random_weights": True, "preset": preset, "seed": seed, **({"fp8": True} if fp8 else {})}
    (out / TINY_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return out


def init_talker_experts(model, seed: int, std: float) -> None:
    """Fill the talker's routed-expert weights (left as `torch.empty` by transformers) with
    N(0, std) draws from a generator seeded by `seed`, in parameter-name order."""
    import torch

    gen = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        for name, param in sorted(model.talker.named_parameters()):
            if name.startswith("model.layers.") and ".mlp.experts." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * std)


def init_talker_router(model, seed: int, std: float) -> None:
    """Fill the talker's router weights (transformers: zeros) from a generator of their own, so the
    experts' weights stay the bytes `init_talker_experts` drew."""
    import torch

    gen = torch.Generator().manual_seed(seed + 104729)
    with torch.no_grad():
        for name, param in sorted(model.talker.named_parameters()):
            if name.startswith("model.layers.") and name.endswith(".mlp.gate.weight"):
                param.copy_(torch.randn(param.shape, generator=gen) * std)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def main(argv: list[str] | None = None) -> int:
    """`omnid make-tiny qwen3-omni DIR [--seed N] [--preset NAME] [--fp8]` (or `python -m` this module)."""
    parser = argparse.ArgumentParser(prog="omnid make-tiny qwen3-omni",
                                     description="write a tiny random-weight Qwen3-Omni checkpoint of the real "
                                                 "architecture (for tests); what it says and speaks is noise",
                                     formatter_class=DefaultsHelp)
    parser.add_argument("out_dir", metavar="DIR", help="the checkpoint directory to write")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--preset", default="tiny-a", choices=sorted(PRESETS),
                        help="sizes: tiny-a (the embedded model's) to tiny-d, each changing the shapes omni must "
                             "not hard-code (layers, widths, experts, code groups, codebook)")
    parser.add_argument("--fill-talker-router", action="store_true",
                        help="random talker router weights (zeros otherwise: a random router's top-k ties "
                             "would differ by device)")
    parser.add_argument("--fp8", action="store_true",
                        help="write the thinker and talker decoder weights as fine-grained FP8 (e4m3, 128x128 "
                             "block scales)")
    args = parser.parse_args(argv)
    path = make_tiny(args.out_dir, seed=args.seed, preset=args.preset, fill_talker_router=args.fill_talker_router,
                     fp8=args.fp8)
    print(f"omnid: wrote a tiny random Qwen3-Omni to {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
