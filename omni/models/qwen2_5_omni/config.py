"""omni's own view of a Qwen2.5-Omni `config.json`'s token2wav part: frozen dataclasses read once.

Defaults mirror transformers' `Qwen2_5OmniDiTConfig` / `Qwen2_5OmniBigVGANConfig`, so a sparse
config.json reads as it does there. Only the audio output end (DiT + BigVGAN) is read here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from omni.models.weights import CheckpointError

ARCHITECTURES = ("Qwen2_5OmniForConditionalGeneration", "Qwen2_5OmniModel")
SPEAKERS_FILE = "spk_dict.pt"


@dataclass(frozen=True)
class DiTConfig:
    """The flow-matching DiT (codes + speaker -> mel). Field names are the reference's."""

    hidden_size: int = 1024
    num_hidden_layers: int = 22
    num_attention_heads: int = 16
    ff_mult: int = 2
    emb_dim: int = 512
    head_dim: int = 64
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    block_size: int = 24  # mel frames per attention block
    look_ahead_layers: tuple[int, ...] = (10,)
    look_backward_layers: tuple[int, ...] = (0, 20)
    repeats: int = 2  # mel frames per codec token
    num_embeds: int = 8193
    mel_dim: int = 80
    enc_emb_dim: int = 192
    enc_dim: int = 128
    enc_channels: tuple[int, ...] = (256, 256, 256, 256, 768)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 64
    enc_res2net_scale: int = 2
    enc_se_channels: int = 64

    @property
    def block_tokens(self) -> int:
        """Codec tokens per attention block (windows of a stream start on these)."""
        return self.block_size // self.repeats


@dataclass(frozen=True)
class BigVGANConfig:
    mel_dim: int = 80
    upsample_initial_channel: int = 1536
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    upsample_rates: tuple[int, ...] = (5, 3, 2, 2, 2, 2)
    upsample_kernel_sizes: tuple[int, ...] = (11, 7, 4, 4, 4, 4)

    @property
    def hop(self) -> int:
        """PCM samples per mel frame (240 at 24 kHz for the published rates)."""
        n = 1
        for r in self.upsample_rates:
            n *= r
        return n


@dataclass(frozen=True)
class Token2WavConfig:
    dit: DiTConfig
    bigvgan: BigVGANConfig
    sample_rate: int = 24000
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def _read(cls, data: dict[str, Any]):
    known = {f.name for f in fields(cls)}
    out = {k: _tuples(v) for k, v in data.items() if k in known}
    if cls is DiTConfig:
        rope = data.get("rope_parameters") or {}
        out["rope_theta"] = float(rope.get("rope_theta", data.get("rope_theta", 10000.0)))
    return cls(**out)


def token2wav_config(data: dict[str, Any]) -> Token2WavConfig:
    """A `token2wav_config` dict (the reference's layout) as omni's config."""
    return Token2WavConfig(_read(DiTConfig, data.get("dit_config") or {}),
                           _read(BigVGANConfig, data.get("bigvgan_config") or {}), raw=data)


def load_config(ckpt_dir: str | Path) -> Token2WavConfig:
    """The token2wav part of a checkpoint's config.json (the whole model's, or token2wav's own)."""
    path = Path(ckpt_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{ckpt_dir} has no config.json")
    data = json.loads(path.read_text())
    if "token2wav_config" in data:
        data = data["token2wav_config"]
    elif "dit_config" not in data:
        raise CheckpointError(f"{path} has no token2wav_config (no audio output)")
    return token2wav_config(data)
