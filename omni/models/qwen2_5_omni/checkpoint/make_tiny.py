"""Tiny random-weight checkpoints of the whole Qwen2.5-Omni (thinker, talker, token2wav), built with
transformers' `Qwen2_5OmniForConditionalGeneration`, and config-only directories that serve random
weights drawn at load.

Two tiny shapes (tiny_presets.py: layers, heads, GQA ratio, widths, tied / untied embeddings, window
attention blocks and the token2wav shapes below all differ), laid out as the published checkpoint is:
`config.json` (thinker_config / talker_config / token2wav_config {dit_config, bigvgan_config}),
model.safetensors, `spk_dict.pt` = {speaker: {"cond", "ref_mel", "bos_token"}}, the tokenizer
(omni/layers/tokenizer_offline), `preprocessor_config.json` and `generation_config.json`;
`omni_tiny.json` says the weights are random. Token2wav's weights are drawn from a generator seeded by
`seed`, scaled by fan-in so the DiT's velocity and the waveform are audible-scale and not clipped flat
(random_load.randomize_token2wav_); the thinker's and talker's are transformers' init at a wide
`initializer_range` (greedy outputs varied, not near-ties).

Without weights (`omni_random.json` instead of model.safetensors; the graph sets `load_format="random"`
on every model stage, which draws its part on its own device, random_load.py): `full-7b` writes the
published sizes (for GPU benchmarks: nothing read from disk, no host copy of the weights), and
`--config-only` a tiny shape's layout (for tests of that path on the CPU).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from omni.models.qwen2_5_omni.checkpoint.tiny_presets import (FULL, IDS, PREPROCESSOR_CONFIG, PRESETS, TINY_MARKER,
                                                             build_config, get_preset, speaker_bos, write_full,
                                                             write_random_marker)
REF_FRAMES = 37

TOKEN2WAV_PRESETS = {
    "tiny-a": {
        "dit_config": {
            "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 2, "head_dim": 16, "ff_mult": 2,
            "emb_dim": 16, "block_size": 8, "look_ahead_layers": [1], "look_backward_layers": [0, 3],
            "repeats": 2, "num_embeds": 64, "mel_dim": 80, "enc_emb_dim": 16, "enc_dim": 16,
            "enc_channels": [32, 32, 32, 64],  # the last (mfa) takes the SE blocks' outputs: 2 x 32
            "enc_kernel_sizes": [5, 3, 3, 1], "enc_dilations": [1, 2, 3, 1],
            "enc_attention_channels": 16, "enc_res2net_scale": 2, "enc_se_channels": 16,
            "max_position_embeddings": 4096, "dropout": 0.0,
        },
        "bigvgan_config": {
            "mel_dim": 80, "upsample_initial_channel": 64, "resblock_kernel_sizes": [3, 7],
            "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]], "upsample_rates": [5, 3, 2, 2, 2, 2],
            "upsample_kernel_sizes": [11, 7, 4, 4, 4, 4],
        },
    },
    "tiny-b": {
        "dit_config": {
            "hidden_size": 48, "num_hidden_layers": 3, "num_attention_heads": 3, "head_dim": 16, "ff_mult": 2,
            "emb_dim": 24, "block_size": 12, "look_ahead_layers": [0], "look_backward_layers": [1],
            "repeats": 4, "num_embeds": 40, "mel_dim": 32, "enc_emb_dim": 8, "enc_dim": 24,
            "enc_channels": [16, 16, 16, 16, 48], "enc_kernel_sizes": [5, 3, 3, 3, 1],
            "enc_dilations": [1, 2, 3, 4, 1],
            "enc_attention_channels": 8, "enc_res2net_scale": 2, "enc_se_channels": 8,
            "max_position_embeddings": 2048, "dropout": 0.0,
        },
        "bigvgan_config": {
            "mel_dim": 32, "upsample_initial_channel": 32, "resblock_kernel_sizes": [3, 5, 7],
            "resblock_dilation_sizes": [[1, 2, 3], [1, 2, 3], [1, 3, 5]], "upsample_rates": [8, 5, 6],
            "upsample_kernel_sizes": [16, 11, 12],
        },
    },
}


# conv_post's extra scale: the residual stacks grow the signal, and a clipped-flat waveform would
# make the waveform comparisons vacuous (these keep well under 1 % of samples at +-1)
POST_GAIN = {"tiny-a": 0.02, "tiny-b": 0.1}


def build_token2wav_config(preset: str):
    """The reference's `Qwen2_5OmniToken2WavConfig` of a preset (not saved)."""
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniToken2WavConfig

    return Qwen2_5OmniToken2WavConfig(**json.loads(json.dumps(TOKEN2WAV_PRESETS[preset])))


def _speakers(cfg, seed: int, bos_tokens: dict[str, int]) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    dit = cfg.dit_config
    return {name: {"cond": torch.randn(1, dit.enc_emb_dim, generator=g),
                   "ref_mel": torch.randn(1, REF_FRAMES + i, dit.mel_dim, generator=g) - 4.0,
                   "bos_token": bos}
            for i, (name, bos) in enumerate(bos_tokens.items())}


def make_tiny(out_dir: str | Path, seed: int = 0, preset: str = "tiny-a", config_only: bool = False) -> Path:
    """Write a tiny Qwen2.5-Omni checkpoint to `out_dir` (`config_only`, or preset `full-7b`: no
    weights, `omni_random.json` instead); returns it."""
    import torch
    from transformers import GenerationConfig, Qwen2_5OmniForConditionalGeneration
    from transformers.utils import logging as hf_logging

    from omni.layers.tokenizer_offline import save_tokenizer
    from omni.models.qwen2_5_omni.checkpoint.random_load import randomize_token2wav_

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if preset == FULL:
        return write_full(out, seed)
    p = get_preset(preset)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the ids of the thinker's vocabulary in the talker's config warn
    try:
        config = build_config(p, build_token2wav_config(preset))
        generation = GenerationConfig(eos_token_id=IDS["<|im_end|>"])
        if config_only:
            config.save_pretrained(str(out))
            generation.save_pretrained(str(out))
        else:
            torch.manual_seed(seed)
            model = Qwen2_5OmniForConditionalGeneration(config).eval()
            randomize_token2wav_(model.token2wav, seed, POST_GAIN[preset])
            model.generation_config = generation
            model.save_pretrained(str(out), safe_serialization=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    save_tokenizer(out)
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2) + "\n")
    torch.save(_speakers(config.token2wav_config, seed, speaker_bos()), out / "spk_dict.pt")
    if config_only:
        write_random_marker(out, preset, seed)
    else:
        (out / TINY_MARKER).write_text(json.dumps({"random_weights": True, "preset": preset, "seed": seed}))
    return out


def main(argv: list[str] | None = None) -> int:
    """`omnid make-tiny qwen2.5-omni DIR [--preset tiny-a|tiny-b|full-7b] [--seed N] [--config-only]`."""
    parser = argparse.ArgumentParser(prog="omnid make-tiny qwen2.5-omni", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", metavar="DIR")
    parser.add_argument("--preset", choices=[*sorted(PRESETS), FULL], default="tiny-a",
                        help="tiny-a / tiny-b: tiny random shapes (noise in, noise out); full-7b: the published "
                             "sizes without weights (each stage draws its random weights at load)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config-only", action="store_true",
                        help="a tiny preset's layout without weights: the server draws them at load, as for full-7b")
    args = parser.parse_args(argv)
    path = make_tiny(args.out_dir, args.seed, args.preset, config_only=args.config_only)
    what = f"{args.preset}, no weights: drawn at load" if args.config_only or args.preset == FULL else args.preset
    print(f"omnid: wrote a random Qwen2.5-Omni ({what}) to {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
