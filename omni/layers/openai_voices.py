"""A checkpoint's own choice of speaker for each of OpenAI's voice names (config.json's
`omni_openai_voices`, e.g. {"alloy": "vivian"}), which overrides omni's table (omni/api/voice_names.py)."""

from __future__ import annotations

import json
from pathlib import Path


def openai_voices(model_dir: str | Path) -> dict[str, str]:
    """{} when the checkpoint says nothing; a malformed entry is an error at load, not at a request."""
    path = Path(model_dir) / "config.json"
    table = json.loads(path.read_text()).get("omni_openai_voices") if path.is_file() else None
    if table is None:
        return {}
    if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
        raise ValueError(f"{path}: omni_openai_voices must map OpenAI voice names to speaker names")
    return dict(table)
