"""omni's own view of a Qwen2.5-Omni `config.json`: frozen dataclasses read once.

Defaults mirror transformers' `Qwen2_5Omni*Config` classes, so a sparse config.json reads as it does
there: the thinker (Qwen2.5 text model, audio encoder, Qwen2.5-VL vision encoder), the talker, and
token2wav (DiT + BigVGAN; `load_config` reads that part alone, `load_omni_config` the whole).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from omni.layers.configs import DecoderConfig, read_decoder
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
    out = {k: _tuples(v) for k, v in data.items() if k in known and v is not None}
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


# ---- the thinker and the talker -------------------------------------------------------------

@dataclass(frozen=True)
class AudioEncoderConfig:
    num_mel_bins: int = 128
    num_layers: int = 32
    num_heads: int = 20
    ffn_dim: int = 5120
    d_model: int = 1280
    output_dim: int = 3584
    n_window: int = 100
    max_source_positions: int = 1500


@dataclass(frozen=True)
class VisionEncoderConfig:
    depth: int = 32
    hidden_size: int = 3584
    intermediate_size: int = 3420
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 14
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    window_size: int = 112
    out_hidden_size: int = 3584
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    hidden_act: str = "silu"
    rope_theta: float = 10000.0


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
    seconds_per_chunk: int
    tie_word_embeddings: bool


@dataclass(frozen=True)
class TalkerConfig:
    text: DecoderConfig
    embedding_size: int
    codec_bos_id: int
    codec_eos_id: int
    codec_pad_id: int
    codec_mask_id: int
    text_bos_id: int
    text_eos_id: int
    text_pad_id: int


@dataclass(frozen=True)
class Qwen2_5OmniConfig:
    thinker: ThinkerConfig
    talker: TalkerConfig | None  # None: no audio output
    token2wav: Token2WavConfig | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


# transformers' class defaults (what a key absent from config.json means)
_TEXT = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
             num_attention_heads=28, num_key_value_heads=4, rms_norm_eps=1e-6, rope_theta=1_000_000.0)
_TALKER = dict(vocab_size=8448, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, head_dim=128, rms_norm_eps=1e-6, rope_theta=1_000_000.0)
_AUDIO_KEYS = {"encoder_layers": "num_layers", "encoder_attention_heads": "num_heads", "encoder_ffn_dim": "ffn_dim"}


def _thinker(d: dict[str, Any]) -> ThinkerConfig:
    a, v = d.get("audio_config") or {}, d.get("vision_config") or {}
    audio = {_AUDIO_KEYS.get(k, k): val for k, val in a.items()}
    vision = {**v, "rope_theta": (v.get("rope_parameters") or {}).get("rope_theta", 10000.0)}
    g = d.get
    text = d.get("text_config") or {}
    return ThinkerConfig(
        text=read_decoder(text, _TEXT), audio=_read(AudioEncoderConfig, audio), vision=_read(VisionEncoderConfig, vision),
        audio_token_id=g("audio_token_index", g("audio_token_id", 151646)),
        image_token_id=g("image_token_index", g("image_token_id", 151655)),
        video_token_id=g("video_token_index", g("video_token_id", 151656)),
        audio_start_token_id=g("audio_start_token_id", 151647),
        vision_start_token_id=g("vision_start_token_id", 151652),
        position_id_per_seconds=g("position_id_per_seconds", 25), seconds_per_chunk=g("seconds_per_chunk", 2),
        tie_word_embeddings=bool(g("tie_word_embeddings", False)),
    )


def _talker(d: dict[str, Any]) -> TalkerConfig:
    g = d.get
    return TalkerConfig(
        text=read_decoder(d, _TALKER), embedding_size=g("embedding_size", 3584),
        codec_bos_id=g("tts_codec_start_token_id", 8293), codec_eos_id=g("tts_codec_end_token_id", 8294),
        codec_pad_id=g("tts_codec_pad_token_id", 8292), codec_mask_id=g("tts_codec_mask_token_id", 8296),
        text_bos_id=g("tts_text_start_token_id", 151860), text_eos_id=g("tts_text_end_token_id", 151861),
        text_pad_id=g("tts_text_pad_token_id", 151859),
    )


def is_qwen2_5_omni(raw: dict[str, Any]) -> bool:
    return bool(set(raw.get("architectures") or ()) & set(ARCHITECTURES)) or raw.get("model_type") == "qwen2_5_omni"


def load_omni_config(ckpt_dir: str | Path) -> Qwen2_5OmniConfig:
    """The whole of a Qwen2.5-Omni checkpoint's config.json."""
    path = Path(ckpt_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{ckpt_dir} has no config.json")
    raw = json.loads(path.read_text())
    if "thinker_config" not in raw:
        raise CheckpointError(f"{path} has no thinker_config: not a Qwen2.5-Omni checkpoint")
    audio_out = raw.get("enable_audio_output", True) and "talker_config" in raw and "token2wav_config" in raw
    return Qwen2_5OmniConfig(_thinker(raw["thinker_config"]), _talker(raw["talker_config"]) if audio_out else None,
                             token2wav_config(raw["token2wav_config"]) if audio_out else None, raw=raw)
