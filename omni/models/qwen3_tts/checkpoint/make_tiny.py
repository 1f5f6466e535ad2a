"""Random-weight Qwen3-TTS checkpoints of the real architecture, in the reference's layout.

    config.json  generation_config.json  model.safetensors  tokenizer files  omni_tiny.json
    speech_tokenizer/   (the 12 Hz codec: h16b's `tiny_tokenizer`)

Written with omni's own modules (the talker, the code predictor, the speaker encoder) so
`omnid make-tiny qwen3-tts DIR --kind base|custom-voice|voice-design` needs no reference
package; the tests check that the reference loads every file with no missing or unexpected
weight. Cross-part constraints honoured: talker vocab = codebook + 1024 (the reference never
samples the top 1024 ids but codec EOS, so codec tags, languages and speakers live there),
code groups = the codec's quantizers, the speaker encoder's width = the talker's. Every
weight is N(0, init_range) from one generator seeded by `seed`, in name order (norm weights 1),
so a seed always writes the same bytes. `omni_tiny.json` says the weights are random.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from omni.help_format import DefaultsHelp
from omni.models.qwen3_tts.checkpoint.presets import PRESETS, Preset, get_preset
from omni.models.qwen3_tts.config import ARCHITECTURE, KINDS, TINY_MARKER, TOKENIZER_12HZ, parse_config

KIND_NAMES = {"base": "base", "custom-voice": "custom_voice", "voice-design": "voice_design",
              **{k: k for k in KINDS}}

# codec tag ids above the codebook, as in the published config (codebook 2048: pad 2148, bos 2149,
# eos 2150, think 2154, nothink 2155, think bos/eos 2156/2157; english 2050, chinese 2055)
CODEC_OFFSETS = {"codec_pad_id": 100, "codec_bos_id": 101, "codec_eos_token_id": 102, "codec_think_id": 106,
                 "codec_nothink_id": 107, "codec_think_bos_id": 108, "codec_think_eos_id": 109}
LANGUAGE_OFFSETS = {"english": 2, "chinese": 7, "japanese": 10, "sichuan_dialect": 26}
SPEAKER_OFFSETS = {"vivian": 1017, "serena": 1018, "eric": 827}  # eric speaks the sichuan dialect
SPEAKER_DIALECTS = {"vivian": False, "serena": False, "eric": "sichuan_dialect"}
GENERATION_CONFIG = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
                     "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_k": 50,
                     "subtalker_top_p": 1.0, "max_new_tokens": 8192}


def kind_of(name: str) -> str:
    try:
        return KIND_NAMES[name]
    except KeyError:
        raise ValueError(f"unknown Qwen3-TTS kind {name!r}; kinds: base, custom-voice, voice-design") from None


def text_tokens(full: bool) -> tuple[Any, dict[str, int], int]:
    """(tokenizer, token ids, text vocab): byte-level offline tokenizers, at the real ids for full size."""
    if full:
        from omni.layers.tokenizer_offline_full import ROLE_IDS, SPECIAL_IDS, build_tokenizer

        return build_tokenizer(), {**SPECIAL_IDS, **ROLE_IDS}, 151936
    from omni.layers.tokenizer_offline import build_tokenizer, token_ids, vocab_size

    return build_tokenizer(), token_ids(), vocab_size()


def build_config(p: Preset, kind: str, ids: dict[str, int], text_vocab: int) -> dict[str, Any]:
    c = p.codebook_size
    rope = {"rope_type": "default", "interleaved": True, "mrope_section": list(p.mrope_section)}
    talker = {
        "model_type": "qwen3_tts_talker", "vocab_size": c + 1024, "hidden_size": p.talker_hidden,
        "intermediate_size": p.talker_ffn, "num_hidden_layers": p.talker_layers,
        "num_attention_heads": p.talker_heads, "num_key_value_heads": p.talker_kv_heads,
        "head_dim": p.talker_head_dim, "hidden_act": "silu", "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6, "rope_theta": p.rope_theta, "rope_scaling": rope, "attention_bias": False,
        "num_code_groups": p.num_code_groups, "text_vocab_size": text_vocab, "text_hidden_size": p.text_hidden,
        "position_id_per_seconds": 13, "initializer_range": p.init_range,
        **{k: c + v for k, v in CODEC_OFFSETS.items()},
        "codec_language_id": {k: c + v for k, v in LANGUAGE_OFFSETS.items()},
        "spk_id": {k: c + v for k, v in SPEAKER_OFFSETS.items()} if kind == "custom_voice" else {},
        "spk_is_dialect": dict(SPEAKER_DIALECTS) if kind == "custom_voice" else {},
        "code_predictor_config": {
            "model_type": "qwen3_tts_talker_code_predictor", "vocab_size": c, "hidden_size": p.predictor_hidden,
            "intermediate_size": p.predictor_ffn, "num_hidden_layers": p.predictor_layers,
            "num_attention_heads": p.predictor_heads, "num_key_value_heads": p.predictor_kv_heads,
            "head_dim": p.predictor_head_dim, "hidden_act": "silu", "max_position_embeddings": 65536,
            "rms_norm_eps": 1e-6, "rope_theta": p.rope_theta, "num_code_groups": p.num_code_groups,
            "initializer_range": p.init_range,
        },
    }
    speaker = {"mel_dim": 128, "enc_dim": p.talker_hidden, "enc_channels": list(p.speaker_channels),
               "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1],
               "enc_attention_channels": p.speaker_attention_channels, "enc_res2net_scale": p.speaker_res2net_scale,
               "enc_se_channels": p.speaker_se_channels, "sample_rate": 24000}
    return {
        "architectures": [ARCHITECTURE], "model_type": "qwen3_tts", "tokenizer_type": TOKENIZER_12HZ,
        "tts_model_size": p.size, "tts_model_type": kind, "talker_config": talker,
        "speaker_encoder_config": speaker, "assistant_token_id": ids["assistant"],
        "im_start_token_id": ids["<|im_start|>"], "im_end_token_id": ids["<|im_end|>"],
        "tts_pad_token_id": ids["<|tts_pad|>"], "tts_bos_token_id": ids["<|tts_bos|>"],
        "tts_eos_token_id": ids["<|tts_eos|>"], "dtype": "float32",
    }


def random_weights(cfg_dict: dict[str, Any], seed: int, std: float, dtype=None, device: str = "cpu") -> dict[str, Any]:
    """Every weight of the checkpoint, under the reference's names, drawn from omni's modules
    (on `device`: a GPU draws the 1.7B sizes in seconds; the bytes then depend on the device)."""
    import torch

    from omni.models.qwen3_tts.modules.talker import TTSTalkerModel

    cfg = parse_config(cfg_dict)
    with torch.device("meta"):
        parts: dict[str, torch.nn.Module] = {"talker.": TTSTalkerModel(cfg)}
        if cfg.kind == "base":
            from omni.models.qwen3_tts.modules.speaker_encoder import SpeakerEncoder  # h16b's

            parts["speaker_encoder."] = SpeakerEncoder(cfg.speaker_encoder)
    gen = torch.Generator(device).manual_seed(seed)
    out = {}
    for prefix, module in parts.items():
        for name, param in sorted(module.named_parameters()):
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                value = torch.ones(param.shape, device=device)
            else:
                value = torch.randn(param.shape, generator=gen, device=device) * std
            out[prefix + name] = value.to(dtype or torch.float32).cpu().contiguous()
    return out


def make_tiny(out_dir: str | Path, kind: str = "custom_voice", preset: str = "tiny-a", seed: int = 0,
              device: str = "cpu") -> Path:
    """Write a random Qwen3-TTS checkpoint (`kind`: base / custom_voice / voice_design, or the
    CLI's dashed names) with the sizes of `preset` to `out_dir` (the talker's weights drawn on `device`)."""
    from omni.models.qwen3_tts.checkpoint.tiny_tokenizer import write_tiny_tokenizer  # h16b's

    out = write_model(out_dir, kind, preset, seed, device)
    p = get_preset(preset)
    write_tiny_tokenizer(out / "speech_tokenizer", num_quantizers=p.num_code_groups, codebook_size=p.codebook_size,
                         preset=preset, seed=seed)
    return out


def write_model(out_dir: str | Path, kind: str, preset: str, seed: int, device: str = "cpu") -> Path:
    """Everything but `speech_tokenizer/`: config, generation config, weights, text tokenizer, marker."""
    import torch
    from safetensors.torch import save_file

    kind = kind_of(kind)
    p = get_preset(preset)
    full = p.codebook_size >= 2048
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer, ids, text_vocab = text_tokens(full)
    cfg = build_config(p, kind, ids, text_vocab)
    dtype = torch.bfloat16 if full else torch.float32
    if full:
        cfg["dtype"] = "bfloat16"
    weights = random_weights(cfg, seed, p.init_range, dtype, device)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen_cfg = {**GENERATION_CONFIG, **({} if full else {"max_new_tokens": 64})}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    tokenizer.save_pretrained(str(out))
    marker = {"random_weights": True, "family": "qwen3-tts", "kind": kind, "preset": preset, "seed": seed}
    (out / TINY_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    """`omnid make-tiny qwen3-tts DIR [--kind K] [--preset P] [--seed N]`
    (also `python -m omni.models.qwen3_tts.checkpoint.make_tiny DIR ...`)."""
    parser = argparse.ArgumentParser(prog="omnid make-tiny qwen3-tts",
                                     description="write a random-weight Qwen3-TTS checkpoint of the real architecture "
                                                 "(the qwen-tts package loads it too); what it says is noise",
                                     formatter_class=DefaultsHelp)
    parser.add_argument("out_dir", metavar="DIR", help="the checkpoint directory to write")
    parser.add_argument("--kind", default="custom-voice", choices=["base", "custom-voice", "voice-design"],
                        help="custom-voice: named speakers (+ instructions for the style); voice-design: the voice "
                             "described in instructions; base: voice cloning from an uploaded clip")
    parser.add_argument("--preset", default="tiny-a", choices=sorted(PRESETS),
                        help="sizes: tiny-a / tiny-b (seconds to write, for tests), full-1.7b (the published size)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--device", default="cpu", help="where the weights are drawn (cuda: fast at full size)")
    args = parser.parse_args(argv)
    print(make_tiny(args.out_dir, kind=args.kind, preset=args.preset, seed=args.seed, device=args.device),
          file=sys.stderr)
    return 0


make_tiny_main = main

if __name__ == "__main__":
    raise SystemExit(main())
