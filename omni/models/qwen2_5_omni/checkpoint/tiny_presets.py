"""Sizes of the random Qwen2.5-Omni checkpoints `make_tiny` writes, their transformers config, and
the published 7B layout without weights (`write_full`; every stage draws its weights at load).

The two tiny shapes differ in what omni's code must not hard-code: layers, heads, the GQA ratio,
head and hidden widths, tied or untied thinker embeddings, the audio encoder's chunk (`n_window`), the
vision encoder's window size and full-attention blocks, the talker's sizes and codebook. Constraints
of the reference: mrope sections sum to head_dim / 2; the talker's `embedding_size` is the thinker's
hidden width; its codec ids sit at the top of its vocabulary, which is token2wav's `num_embeds` + 1
(every code the talker can emit is one the DiT can embed); the speakers' `bos_token`s and the talker's
text ids are thinker ids; `vision_start_token_id` is passed to the thinker although it is not declared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from omni.layers.tokenizer_offline import token_ids, vocab_size
from omni.models.loading import RANDOM_MARKER

TINY_MARKER = "omni_tiny.json"  # next to random weights written out
FULL = "full-7b"
IDS = token_ids()
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

PREPROCESSOR_CONFIG = {  # the published layout, with a small pixel budget (4..16 merged tokens per image)
    "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128, "sampling_rate": 16000,
    "hop_length": 160, "n_fft": 400, "chunk_length": 30, "padding_value": 0.0, "return_attention_mask": True,
    "dither": 0.0, "image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14, "merge_size": 2,
    "temporal_patch_size": 2, "min_pixels": 56 * 56, "max_pixels": 112 * 112, "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD, "processor_class": "Qwen2_5OmniProcessor",
    # the video processor's (omni reads these; transformers' processor defaults to 128..768 x 28 x 28
    # pixels a frame and fps 2): a small budget here too
    "video_min_pixels": 56 * 56, "video_max_pixels": 112 * 112, "video_fps": 2.0,
}
VIDEO_KEYS = ("video_min_pixels", "video_max_pixels", "video_fps")


@dataclass(frozen=True)
class TinyPreset:
    thinker_layers: int
    thinker_hidden: int
    thinker_heads: int
    thinker_kv_heads: int
    mrope_section: tuple[int, int, int]
    tied: bool
    audio_layers: int
    audio_d_model: int
    audio_heads: int
    n_window: int
    vision_depth: int
    vision_hidden: int
    vision_heads: int
    window_size: int
    fullatt_blocks: tuple[int, ...]
    talker_layers: int
    talker_hidden: int
    talker_heads: int
    talker_kv_heads: int
    talker_mrope_section: tuple[int, int, int]
    codebook: int  # token2wav's num_embeds (make_tiny's TOKEN2WAV_PRESETS)
    init_range: float = 0.3
    talker_head_dim: int = 0  # 0: talker_hidden // talker_heads


PRESETS = {
    "tiny-a": TinyPreset(thinker_layers=2, thinker_hidden=32, thinker_heads=4, thinker_kv_heads=2,
                         mrope_section=(2, 1, 1), tied=False, audio_layers=2, audio_d_model=16, audio_heads=2,
                         n_window=50, vision_depth=2, vision_hidden=16, vision_heads=2, window_size=56,
                         fullatt_blocks=(1,), talker_layers=2, talker_hidden=24, talker_heads=2, talker_kv_heads=1,
                         talker_mrope_section=(2, 2, 2), codebook=64),
    "tiny-b": TinyPreset(thinker_layers=3, thinker_hidden=48, thinker_heads=6, thinker_kv_heads=1,
                         mrope_section=(2, 1, 1), tied=True, audio_layers=1, audio_d_model=24, audio_heads=3,
                         n_window=25, vision_depth=3, vision_hidden=24, vision_heads=3, window_size=112,
                         fullatt_blocks=(0, 2), talker_layers=3, talker_hidden=32, talker_heads=4, talker_kv_heads=2,
                         talker_mrope_section=(2, 1, 1), codebook=40),
}


def get_preset(name: str) -> TinyPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)} and {FULL!r}") from None


def speaker_bos(ids: dict[str, int] = IDS) -> dict[str, int]:
    """Each speaker's text bos token (a thinker id; the published model has its own tokens)."""
    return {"Chelsie": ids["<|vision_pad|>"], "Ethan": ids["<|endoftext|>"]}


def codec_ids(vocab: int) -> dict[str, int]:
    return {"tts_codec_pad_token_id": vocab - 4, "tts_codec_start_token_id": vocab - 3,
            "tts_codec_end_token_id": vocab - 2, "tts_codec_mask_token_id": vocab - 1}


def _mm_ids(ids: dict[str, int]) -> dict[str, int]:
    return {"audio_token_index": ids["<|audio_pad|>"], "image_token_index": ids["<|image_pad|>"],
            "video_token_index": ids["<|video_pad|>"], "audio_start_token_id": ids["<|audio_start|>"],
            "audio_end_token_id": ids["<|audio_end|>"], "vision_start_token_id": ids["<|vision_start|>"]}


def config_dict(p: TinyPreset, token2wav: dict, vocab: int, ids: dict[str, int]) -> dict:
    """The `Qwen2_5OmniConfig` arguments of a preset (plain dicts)."""
    head = p.thinker_hidden // p.thinker_heads
    talker_head = p.talker_head_dim or p.talker_hidden // p.talker_heads
    if sum(p.mrope_section) * 2 != head or sum(p.talker_mrope_section) * 2 != talker_head:
        raise ValueError("mrope_section must sum to head_dim / 2")
    rope = {"rope_type": "default", "rope_theta": 1_000_000.0}
    init = p.init_range
    thinker = {
        "text_config": {"vocab_size": vocab, "hidden_size": p.thinker_hidden, "intermediate_size": 2 * p.thinker_hidden,
                        "num_hidden_layers": p.thinker_layers, "num_attention_heads": p.thinker_heads,
                        "num_key_value_heads": p.thinker_kv_heads, "max_position_embeddings": 4096,
                        "rope_parameters": {**rope, "mrope_section": list(p.mrope_section)},
                        "tie_word_embeddings": p.tied, "initializer_range": init},
        "audio_config": {"num_mel_bins": 128, "encoder_layers": p.audio_layers, "encoder_attention_heads": p.audio_heads,
                         "encoder_ffn_dim": 2 * p.audio_d_model, "d_model": p.audio_d_model,
                         "output_dim": p.thinker_hidden, "n_window": p.n_window, "max_source_positions": 1500,
                         "initializer_range": init},
        "vision_config": {"depth": p.vision_depth, "hidden_size": p.vision_hidden, "intermediate_size": 2 * p.vision_hidden,
                          "num_heads": p.vision_heads, "patch_size": 14, "spatial_merge_size": 2,
                          "temporal_patch_size": 2, "window_size": p.window_size, "out_hidden_size": p.thinker_hidden,
                          "fullatt_block_indexes": list(p.fullatt_blocks), "initializer_range": init},
        **_mm_ids(ids), "user_token_id": ids["user"], "position_id_per_seconds": 25, "seconds_per_chunk": 2,
        "tie_word_embeddings": p.tied, "initializer_range": init,
    }
    talker_vocab = token2wav["dit_config"]["num_embeds"] + 1
    talker = {
        "vocab_size": talker_vocab, "embedding_size": p.thinker_hidden, "hidden_size": p.talker_hidden,
        "intermediate_size": 2 * p.talker_hidden, "num_hidden_layers": p.talker_layers,
        "num_attention_heads": p.talker_heads, "num_key_value_heads": p.talker_kv_heads, "head_dim": talker_head,
        "max_position_embeddings": 4096, "rope_parameters": {**rope, "mrope_section": list(p.talker_mrope_section)},
        **codec_ids(talker_vocab), "tts_text_start_token_id": ids["<|tts_bos|>"],
        "tts_text_end_token_id": ids["<|tts_eos|>"], "tts_text_pad_token_id": ids["<|tts_pad|>"], **_mm_ids(ids),
        "vision_end_token_id": ids["<|vision_end|>"], "spatial_merge_size": 2, "position_id_per_seconds": 25,
        "initializer_range": init,
    }
    return {"thinker_config": thinker, "talker_config": talker, "token2wav_config": token2wav,
            "enable_audio_output": True, "architectures": ["Qwen2_5OmniForConditionalGeneration"]}


def build_config(p: TinyPreset, token2wav):
    from transformers import Qwen2_5OmniConfig

    kwargs = config_dict(p, token2wav.to_dict(), vocab_size(), IDS)
    return Qwen2_5OmniConfig(**kwargs)


# the Qwen2.5-Omni-7B sizes: the thinker is Qwen2.5-7B's, the vision and audio towers Qwen2.5-VL's and
# Whisper-large's widths, token2wav the reference's class defaults; the talker's are the best known here
# (hidden 896, 24 layers, 12 heads / 4 KV of 64): a benchmark shape, not a published config read back
FULL_SIZES = TinyPreset(thinker_layers=28, thinker_hidden=3584, thinker_heads=28, thinker_kv_heads=4,
                        mrope_section=(16, 24, 24), tied=False, audio_layers=32, audio_d_model=1280, audio_heads=20,
                        n_window=100, vision_depth=32, vision_hidden=1280, vision_heads=16, window_size=112,
                        fullatt_blocks=(7, 15, 23, 31), talker_layers=24, talker_hidden=896, talker_heads=12,
                        talker_kv_heads=4, talker_mrope_section=(16, 16, 0), codebook=8192, init_range=0.02,
                        talker_head_dim=64)


def write_random_marker(out: Path, preset: str, seed: int) -> None:
    """`omni_random.json`: the directory has no weights, every model stage draws them (seeded) at load."""
    marker = {"random_weights": True, "load_format": "random", "preset": preset, "seed": seed}
    (out / RANDOM_MARKER).write_text(json.dumps(marker) + "\n")


def write_full(out: Path, seed: int) -> Path:
    """The 7B layout without weights: config.json, a tokenizer at the real Qwen ids (byte-level, no merges),
    the processor config, speakers, and `omni_random.json` (each stage draws its weights on its device)."""
    import torch
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniToken2WavConfig

    from omni.layers.tokenizer_offline_full import ROLE_IDS, SPECIAL_IDS, build_tokenizer

    ids = {**SPECIAL_IDS, **ROLE_IDS}
    token2wav = Qwen2_5OmniToken2WavConfig().to_dict()
    config = config_dict(FULL_SIZES, token2wav, 152064, ids)
    config["thinker_config"]["text_config"]["intermediate_size"] = 18944
    config["thinker_config"]["audio_config"]["encoder_ffn_dim"] = 5120
    config["thinker_config"]["vision_config"]["intermediate_size"] = 3420
    config["talker_config"].update(intermediate_size=18944, vocab_size=8448, tts_codec_pad_token_id=8292,
                                   tts_codec_start_token_id=8293, tts_codec_end_token_id=8294,
                                   tts_codec_mask_token_id=8296)
    config["model_type"] = "qwen2_5_omni"
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    build_tokenizer().save_pretrained(str(out))
    extra = {k: v for k, v in PREPROCESSOR_CONFIG.items() if k not in VIDEO_KEYS}
    extra.update(min_pixels=3136, max_pixels=12845056)
    (out / "preprocessor_config.json").write_text(json.dumps(extra, indent=2) + "\n")
    g = torch.Generator().manual_seed(seed + 1)
    dit = token2wav["dit_config"]
    speakers = {name: {"cond": torch.randn(1, dit["enc_emb_dim"], generator=g),
                       "ref_mel": torch.randn(1, 37, dit["mel_dim"], generator=g) - 4.0, "bos_token": bos}
                for name, bos in {"Chelsie": 151870, "Ethan": 151871}.items()}
    torch.save(speakers, out / "spk_dict.pt")
    write_random_marker(out, FULL, seed)
    return out
