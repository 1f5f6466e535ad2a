"""Tiny random-weight checkpoints of Qwen2.5-Omni's token2wav (DiT + BigVGAN), built with transformers.

Two shapes (`tiny-a`: 50 Hz-like codes, the published BigVGAN rates; `tiny-b`: 4 mel frames per
token, other rates, fewer layers), laid out as the published checkpoint is: `config.json` with a
`token2wav_config` {`dit_config`, `bigvgan_config`}, tensors under `token2wav.` in
model.safetensors, and `spk_dict.pt` = {speaker: {"cond", "ref_mel", "bos_token"}}. Only the
audio output end is written (no thinker, no talker); `omni_tiny.json` says so. The weights are drawn
from a generator seeded by `seed`, scaled by fan-in so the DiT's velocity and the waveform are
audible-scale and not clipped flat.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TINY_MARKER = "omni_tiny.json"
SPEAKERS = {"Chelsie": 151870, "Ethan": 151871}  # speaker -> its bos token (a thinker id)
REF_FRAMES = 37

PRESETS = {
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


def build_config(preset: str):
    """The reference's `Qwen2_5OmniToken2WavConfig` of a preset (not saved)."""
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniToken2WavConfig

    return Qwen2_5OmniToken2WavConfig(**json.loads(json.dumps(PRESETS[preset])))


def _randomize(model, seed: int, post_gain: float = 1.0) -> None:
    """Every parameter from one seeded generator: matrices ~ N(0, 1/fan_in), vectors small."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() >= 2:
                fan_in = p[0].numel() if not name.endswith("codec_embed.weight") else 1
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
        model.code2wav_bigvgan_model.conv_post.weight.mul_(post_gain)


def _speakers(cfg, seed: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    dit = cfg.dit_config
    return {name: {"cond": torch.randn(1, dit.enc_emb_dim, generator=g),
                   "ref_mel": torch.randn(1, REF_FRAMES + i, dit.mel_dim, generator=g) - 4.0,
                   "bos_token": bos}
            for i, (name, bos) in enumerate(SPEAKERS.items())}


def make_tiny(out_dir: str | Path, seed: int = 0, preset: str = "tiny-a") -> Path:
    """Write a tiny token2wav checkpoint to `out_dir`; returns the directory."""
    import torch
    from safetensors.torch import save_file
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = build_config(preset)
    model = Qwen2_5OmniToken2WavModel(cfg).eval()
    _randomize(model, seed, POST_GAIN[preset])
    state = {f"token2wav.{k}": v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["Qwen2_5OmniForConditionalGeneration"], "model_type": "qwen2_5_omni",
              "enable_audio_output": True, "token2wav_config": cfg.to_dict()}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    torch.save(_speakers(cfg, seed), out / "spk_dict.pt")
    (out / TINY_MARKER).write_text(json.dumps({"random": True, "preset": preset, "seed": seed,
                                               "parts": ["token2wav"]}))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny-a")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(make_tiny(args.out_dir, args.seed, args.preset))


if __name__ == "__main__":
    main()
