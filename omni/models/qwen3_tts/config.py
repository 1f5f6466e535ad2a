"""omni's own view of a Qwen3-TTS `config.json` (`Qwen3TTSConfig` of the `qwen-tts` reference).

Strict where a wrong guess would speak wrongly: an unknown `tts_model_type`, a tokenizer other than
the 12 Hz one, a RoPE scaling or sliding window the talker does not implement, ids outside the
vocabularies are all `CheckpointError`s. Defaults mirror the reference's config classes, so a
sparse config.json reads as it does there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni.layers.configs import DecoderConfig
from omni.models.weights import CheckpointError

ARCHITECTURE = "Qwen3TTSForConditionalGeneration"
KINDS = ("base", "custom_voice", "voice_design")
TINY_MARKER = "omni_tiny.json"  # beside a random-weight checkpoint (make-tiny writes it; the same as Qwen3-Omni's)
TOKENIZER_12HZ = "qwen3_tts_tokenizer_12hz"

# the reference's config-class defaults (what a key absent from config.json means)
_TALKER = dict(vocab_size=3072, hidden_size=1024, intermediate_size=2048, num_hidden_layers=20,
               num_attention_heads=16, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=10000.0,
               max_position_embeddings=32768, hidden_act="silu")
_PREDICTOR = dict(vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                  rope_theta=10000.0, max_position_embeddings=32768, hidden_act="silu")
_SPEAKER_ENCODER = dict(mel_dim=128, enc_dim=1024, enc_channels=[512, 512, 512, 512, 1536],
                        enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1],
                        enc_attention_channels=128, enc_res2net_scale=8, enc_se_channels=128, sample_rate=24000)
_CODEC_IDS = dict(codec_eos_token_id=4198, codec_think_id=4202, codec_nothink_id=4203, codec_think_bos_id=4204,
                  codec_think_eos_id=4205, codec_pad_id=4196, codec_bos_id=4197)
_TOKENS = dict(im_start_token_id=151644, im_end_token_id=151645, tts_pad_token_id=151671,
               tts_bos_token_id=151672, tts_eos_token_id=151673)


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """The ECAPA-style speaker encoder of a Base checkpoint (its x-vector is a talker input row)."""

    mel_dim: int
    enc_dim: int
    enc_channels: tuple[int, ...]
    enc_kernel_sizes: tuple[int, ...]
    enc_dilations: tuple[int, ...]
    enc_attention_channels: int
    enc_res2net_scale: int
    enc_se_channels: int
    sample_rate: int


@dataclass(frozen=True)
class CodecIds:
    """The talker's codec control ids (group-0 vocabulary, above the codebook)."""

    pad: int
    bos: int
    eos: int
    think: int
    nothink: int
    think_bos: int
    think_eos: int


@dataclass(frozen=True)
class TextIds:
    im_start: int
    im_end: int
    tts_pad: int
    tts_bos: int
    tts_eos: int


@dataclass(frozen=True)
class Qwen3TTSConfig:
    kind: str  # "base" | "custom_voice" | "voice_design"
    size: str  # "0b6", "1b7" (the reference drops instructions for "0b6" CustomVoice)
    talker: DecoderConfig
    code_predictor: DecoderConfig
    num_code_groups: int
    text_vocab_size: int
    text_hidden_size: int
    codec: CodecIds
    text: TextIds
    speakers: dict[str, int]  # lower-case name -> codec id of its embedding row
    speaker_dialects: dict[str, str]  # name -> dialect language key (speakers with one only)
    languages: dict[str, int]  # lower-case language -> codec id
    speaker_encoder: SpeakerEncoderConfig | None  # Base only
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def supported_languages(self) -> list[str]:
        """"auto" and every non-dialect language, as the reference lists them."""
        return ["auto"] + [k for k in self.languages if "dialect" not in k]

    @property
    def voices(self) -> list[str]:
        return list(self.speakers)


def read_config_json(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{model_dir}: no config.json") from None
    except ValueError as exc:
        raise CheckpointError(f"{path}: not JSON ({exc})") from None


def load_config(model_dir: str | Path) -> Qwen3TTSConfig:
    return parse_config(read_config_json(model_dir))


def parse_config(d: dict[str, Any]) -> Qwen3TTSConfig:
    archs = d.get("architectures") or [ARCHITECTURE]
    if ARCHITECTURE not in archs:
        raise CheckpointError(f"not a Qwen3-TTS checkpoint: architectures {archs}")
    kind = d.get("tts_model_type")
    if kind not in KINDS:
        raise CheckpointError(f"unknown tts_model_type {kind!r}; known: {', '.join(KINDS)}")
    tokenizer = d.get("tokenizer_type") or TOKENIZER_12HZ
    if tokenizer != TOKENIZER_12HZ:
        raise CheckpointError(f"tokenizer_type {tokenizer!r} is not supported (only {TOKENIZER_12HZ})")
    t = d.get("talker_config") or {}
    groups = int(t.get("num_code_groups", 32))
    talker = _decoder(t, _TALKER, "talker_config")
    cp_raw = t.get("code_predictor_config") or {}
    predictor = _decoder(cp_raw, _PREDICTOR, "code_predictor_config")
    if int(cp_raw.get("num_code_groups", groups)) != groups:
        raise CheckpointError("code_predictor_config.num_code_groups differs from talker_config.num_code_groups")
    if groups < 2:
        raise CheckpointError(f"num_code_groups must be >= 2, got {groups}")
    codec = CodecIds(**{k: int(t.get(name, default)) for k, name, default in (
        ("pad", "codec_pad_id", _CODEC_IDS["codec_pad_id"]), ("bos", "codec_bos_id", _CODEC_IDS["codec_bos_id"]),
        ("eos", "codec_eos_token_id", _CODEC_IDS["codec_eos_token_id"]),
        ("think", "codec_think_id", _CODEC_IDS["codec_think_id"]),
        ("nothink", "codec_nothink_id", _CODEC_IDS["codec_nothink_id"]),
        ("think_bos", "codec_think_bos_id", _CODEC_IDS["codec_think_bos_id"]),
        ("think_eos", "codec_think_eos_id", _CODEC_IDS["codec_think_eos_id"]))})
    text = TextIds(**{k: int(d.get(f"{k}_token_id", _TOKENS[f"{k}_token_id"]))
                      for k in ("im_start", "im_end", "tts_pad", "tts_bos", "tts_eos")})
    text_vocab = int(t.get("text_vocab_size", 151936))
    speakers = _id_map(t.get("spk_id"), "spk_id")
    languages = _id_map(t.get("codec_language_id"), "codec_language_id")
    dialects = {}
    for name, value in (t.get("spk_is_dialect") or {}).items():
        if value is False or value is None:
            continue
        if not isinstance(value, str) or value.lower() not in languages:
            raise CheckpointError(f"spk_is_dialect[{name!r}] = {value!r} names no codec language")
        dialects[name.lower()] = value.lower()
    for name, value in [*vars(codec).items(), *((f"speaker {k}", v) for k, v in speakers.items()),
                        *((f"language {k}", v) for k, v in languages.items())]:
        if not 0 <= value < talker.vocab_size:
            raise CheckpointError(f"codec id {name} = {value} is outside the talker vocabulary of {talker.vocab_size}")
    for name, value in vars(text).items():
        if not 0 <= value < text_vocab:
            raise CheckpointError(f"{name}_token_id {value} is outside the text vocabulary of {text_vocab}")
    if kind == "custom_voice" and not speakers:
        raise CheckpointError("a custom_voice checkpoint needs named speakers (talker_config.spk_id)")
    encoder = None
    if kind == "base":
        encoder = _speaker_encoder(d.get("speaker_encoder_config") or {})
        if encoder.enc_dim != talker.hidden_size:
            raise CheckpointError(f"speaker_encoder_config.enc_dim {encoder.enc_dim} differs from the talker's "
                                  f"hidden size {talker.hidden_size} (the x-vector is a talker input row)")
    return Qwen3TTSConfig(
        kind=kind, size=str(d.get("tts_model_size") or ""), talker=talker, code_predictor=predictor,
        num_code_groups=groups, text_vocab_size=text_vocab,
        text_hidden_size=int(t.get("text_hidden_size", 2048)), codec=codec, text=text, speakers=speakers,
        speaker_dialects=dialects, languages=languages, speaker_encoder=encoder, raw=d,
    )


def _decoder(d: dict[str, Any], defaults: dict[str, Any], where: str) -> DecoderConfig:
    g = {**defaults, **d}.get
    if g("use_sliding_window", False):
        raise CheckpointError(f"{where}: sliding-window attention is not supported")
    scaling = d.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type != "default":
        raise CheckpointError(f"{where}: rope type {rope_type!r} is not supported (default only)")
    if g("hidden_act") != "silu":
        raise CheckpointError(f"{where}: hidden_act {g('hidden_act')!r} is not supported (silu only)")
    heads = int(g("num_attention_heads"))
    return DecoderConfig(
        vocab_size=int(g("vocab_size")), hidden_size=int(g("hidden_size")),
        intermediate_size=int(g("intermediate_size")), num_layers=int(g("num_hidden_layers")), num_heads=heads,
        num_kv_heads=int(g("num_key_value_heads") or heads), head_dim=int(g("head_dim") or g("hidden_size") // heads),
        rms_norm_eps=float(g("rms_norm_eps")), rope_theta=float(g("rope_theta")),
        # every talker position id is text-like (the same on all three M-RoPE axes): plain 1-D RoPE
        mrope_section=tuple(scaling.get("mrope_section") or ()), mrope_interleaved=bool(scaling.get("interleaved")),
        max_position_embeddings=int(g("max_position_embeddings")), hidden_act="silu", raw=d,
    )


def _id_map(value: Any, where: str) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, int) for v in value.values()):
        raise CheckpointError(f"talker_config.{where} must map names to integer ids, got {value!r}")
    return {str(k).lower(): int(v) for k, v in value.items()}


def _speaker_encoder(d: dict[str, Any]) -> SpeakerEncoderConfig:
    unknown = set(d) - set(_SPEAKER_ENCODER)
    if unknown:
        raise CheckpointError(f"speaker_encoder_config has unknown keys {sorted(unknown)}")
    g = {**_SPEAKER_ENCODER, **d}
    return SpeakerEncoderConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in g.items()})
