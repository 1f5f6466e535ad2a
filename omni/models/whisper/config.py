"""A Whisper checkpoint's sizes and special tokens, read once from its directory.

config.json gives the sizes; generation_config.json (when present) the decoding settings;
special token ids are recomputed from the vocabulary layout so a checkpoint without a
generation config (e.g. a tiny random one) still decodes like transformers does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from omni.kernel.errors import InvalidRequest

LANGUAGES = (  # Whisper's language order: token sot + 1 + i
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr bg lt "
    "la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn yo so af "
    "oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su yue"
).split()


class WhisperConfigError(ValueError):
    """A checkpoint directory that is not a usable Whisper (names the problem)."""


@dataclass
class WhisperConfig:
    vocab_size: int
    d_model: int
    num_mel_bins: int
    encoder_layers: int
    decoder_layers: int
    encoder_heads: int
    decoder_heads: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int
    max_source_positions: int
    max_target_positions: int
    tie_word_embeddings: bool = True
    suppress_tokens: list[int] = field(default_factory=list)
    begin_suppress_tokens: list[int] = field(default_factory=list)
    max_initial_timestamp_index: int | None = 50

    # ---- special tokens (the layout every Whisper vocabulary follows) ------------------
    @property
    def multilingual(self) -> bool:
        return self.vocab_size >= 51865

    @property
    def eot(self) -> int:
        return 50257 if self.multilingual else 50256

    @property
    def sot(self) -> int:
        return self.eot + 1

    @property
    def num_languages(self) -> int:
        return self.vocab_size - 51765 - int(self.multilingual)

    @property
    def translate(self) -> int:
        return self.sot + 1 + self.num_languages

    @property
    def transcribe(self) -> int:
        return self.translate + 1

    @property
    def sot_prev(self) -> int:
        return self.translate + 3

    @property
    def no_speech(self) -> int:
        return self.translate + 4

    @property
    def no_timestamps(self) -> int:
        return self.translate + 5

    @property
    def timestamp_begin(self) -> int:
        return self.no_timestamps + 1

    def language_ids(self) -> dict[str, int]:
        return {code: self.sot + 1 + i for i, code in enumerate(LANGUAGES[: self.num_languages])}

    def language_token(self, language: str) -> int:
        ids = self.language_ids()
        code = language.strip().lower()
        code = _LANGUAGE_NAMES.get(code, code)
        if code not in ids:
            raise InvalidRequest(f"unknown language {language!r}; use an ISO 639-1 code such as 'en' "
                                 f"(this model knows {len(ids)})")
        return ids[code]

    @property
    def head_dim(self) -> int:
        return self.d_model // self.decoder_heads

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "WhisperConfig":
        model_dir = Path(model_dir)
        path = model_dir / "config.json"
        if not path.is_file():
            raise WhisperConfigError(f"{model_dir}: no config.json")
        raw = json.loads(path.read_text())
        if raw.get("model_type") != "whisper":
            raise WhisperConfigError(f"{path}: model_type is {raw.get('model_type')!r}, not 'whisper'")
        gen_path = model_dir / "generation_config.json"
        gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
        cfg = cls(
            vocab_size=raw["vocab_size"], d_model=raw["d_model"], num_mel_bins=raw["num_mel_bins"],
            encoder_layers=raw["encoder_layers"], decoder_layers=raw["decoder_layers"],
            encoder_heads=raw["encoder_attention_heads"], decoder_heads=raw["decoder_attention_heads"],
            encoder_ffn_dim=raw["encoder_ffn_dim"], decoder_ffn_dim=raw["decoder_ffn_dim"],
            max_source_positions=raw["max_source_positions"], max_target_positions=raw["max_target_positions"],
            tie_word_embeddings=raw.get("tie_word_embeddings", True),
            suppress_tokens=list(gen.get("suppress_tokens", raw.get("suppress_tokens")) or []),
            begin_suppress_tokens=list(gen.get("begin_suppress_tokens", raw.get("begin_suppress_tokens")) or []),
            max_initial_timestamp_index=gen.get("max_initial_timestamp_index", 50 if gen else None),
        )
        if raw.get("activation_function", "gelu") != "gelu":
            raise WhisperConfigError(f"{path}: activation {raw['activation_function']!r} is not supported")
        if raw.get("scale_embedding"):
            raise WhisperConfigError(f"{path}: scale_embedding is not supported")
        if cfg.d_model % cfg.decoder_heads or cfg.d_model % cfg.encoder_heads:
            raise WhisperConfigError(f"{path}: d_model {cfg.d_model} does not split into the attention heads")
        if cfg.vocab_size < 51864:
            raise WhisperConfigError(f"{path}: vocab_size {cfg.vocab_size} is smaller than Whisper's (51864)")
        return cfg


_LANGUAGE_NAMES = {"english": "en", "chinese": "zh", "german": "de", "spanish": "es", "russian": "ru",
                   "korean": "ko", "french": "fr", "japanese": "ja", "portuguese": "pt", "turkish": "tr",
                   "polish": "pl", "dutch": "nl", "arabic": "ar", "swedish": "sv", "italian": "it",
                   "hindi": "hi", "finnish": "fi", "vietnamese": "vi", "ukrainian": "uk", "greek": "el"}
