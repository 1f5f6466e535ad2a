"""Tokens <-> text for Whisper: prompts, decoded text, timed segments, and stitching windows.

Text comes from the checkpoint's byte-level BPE `tokenizer.json` (the `tokenizers` library);
special tokens (id >= end-of-text) never reach the text. Timestamp tokens (<|0.00|> ... in
0.02 s steps) cut a window's output into segments, offset by the window's start in the clip.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omni.kernel.errors import InvalidRequest
from omni.models.whisper.config import WhisperConfig

SECONDS_PER_TIMESTAMP = 0.02
MAX_PROMPT_TOKENS = 223  # Whisper keeps at most max_target_positions // 2 - 1 prompt tokens


@dataclass
class Segment:
    start: float
    end: float
    text: str
    tokens: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"start": round(self.start, 3), "end": round(self.end, 3), "text": self.text, "tokens": self.tokens}


class WhisperText:
    def __init__(self, model_dir: str | Path, cfg: WhisperConfig) -> None:
        from tokenizers import Tokenizer

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{model_dir}: no tokenizer.json")
        self.tok = Tokenizer.from_file(str(path))
        self.cfg = cfg

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode([t for t in ids if t < self.cfg.eot], skip_special_tokens=True)

    def prompt(self, language: int | None, task: str, timestamps: bool, previous_text: str | None = None) -> list[int]:
        """[<|startofprev|> prompt...] <|startoftranscript|> [lang task] [<|notimestamps|>]"""
        cfg = self.cfg
        ids: list[int] = []
        if previous_text and previous_text.strip():
            text_ids = self.tok.encode(" " + previous_text.strip(), add_special_tokens=False).ids
            ids = [cfg.sot_prev, *text_ids[-MAX_PROMPT_TOKENS:]]
        ids.append(cfg.sot)
        if cfg.multilingual:
            if language is None:
                raise InvalidRequest("a multilingual Whisper needs a language (or detection) first")
            ids += [language, cfg.translate if task == "translate" else cfg.transcribe]
        if not timestamps:
            ids.append(cfg.no_timestamps)
        return ids

    def segments(self, ids: list[int], offset_s: float, duration_s: float) -> list[Segment]:
        """Cut timestamped output into segments; an unclosed last segment ends at the window's end."""
        tb, out = self.cfg.timestamp_begin, []
        start: float | None = None
        text_ids: list[int] = []
        for t in ids:
            if t >= tb:
                stamp = offset_s + min((t - tb) * SECONDS_PER_TIMESTAMP, duration_s)  # never past the window
                if start is None:
                    start = stamp
                elif text_ids:
                    out.append(Segment(start, stamp, self.decode(text_ids), text_ids))
                    start, text_ids = None, []
                else:
                    start = stamp
            elif t < self.cfg.eot:
                text_ids.append(t)
        if text_ids:
            out.append(Segment(offset_s if start is None else start, offset_s + duration_s, self.decode(text_ids),
                               text_ids))
        return out


def join_texts(parts: list[str]) -> str:
    """Concatenate windows' texts with one space between words that would otherwise touch."""
    out = ""
    for part in parts:
        if out and part and not out[-1].isspace() and not part[0].isspace():
            out += " "
        out += part
    return out
