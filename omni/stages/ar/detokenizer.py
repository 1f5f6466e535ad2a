"""Incremental detokenization: token ids in, text deltas out, never half a character.

A byte-level tokenizer can split one UTF-8 character over several tokens, so decoding each new
token alone would give replacement characters. `TextStream` decodes a short window (from the
last emitted boundary to the end) and emits only text that no later token can change; what
stays held back is flushed when the request ends. Special tokens (EOS, ...) are skipped.
The concatenated deltas equal `tokenizer.decode(all_ids, skip_special_tokens=True)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PARTIAL = "\ufffd"


def load_tokenizer(model_dir: str | Path) -> Any:
    """The checkpoint's fast tokenizer: `tokenizer.json` directly (no transformers import), else the
    one transformers builds from the checkpoint's vocabulary files."""
    path = Path(model_dir) / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(path))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir)).backend_tokenizer


class TextStream:
    """One request's detokenizer state."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # start of the decode window: a character boundary already emitted
        self._read = 0  # ids up to here have been emitted as text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, new_ids: list[int]) -> str:
        """Add tokens; return the text that is now final."""
        self.ids.extend(int(t) for t in new_ids)
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        text = self._decode(self.ids[self._prefix:])
        if len(text) > len(prefix_text) and not text.endswith(PARTIAL):
            self._prefix, self._read = self._read, len(self.ids)
            return text[len(prefix_text):]
        return ""

    def flush(self) -> str:
        """The request ended: whatever is held back, even an incomplete character."""
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        text = self._decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return text[len(prefix_text):]
