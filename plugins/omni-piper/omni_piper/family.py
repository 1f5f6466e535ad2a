"""The `piper` model family: a Piper voice served as sentences -> synth -> resample.

    omnid serve --model piper                     # the bundled en_US "joe" voice
    omnid serve --family piper --model VOICE_DIR  # a directory with one *.onnx and its .onnx.json
"""

from __future__ import annotations

from typing import Any

from omni.kernel.graph import OUT, EdgeSpec, Graph, StageSpec
from omni.models.registry import ModelInfo
from omni_piper.voice import find_voice

OUTPUT_RATE = 24000  # OpenAI's pcm rate: no format needs a second resampling in the API


def build(model_dir: str | None = None, variant: str | None = None, **options: Any) -> tuple[Graph, ModelInfo]:
    if variant not in (None, "speech"):
        raise ValueError(f"the piper family has one variant, 'speech'; got {variant!r}")
    voice = find_voice(model_dir)
    rate = int(options.get("sample_rate", OUTPUT_RATE))
    graph = Graph(
        name="piper",
        stages=[
            StageSpec("text", "piper.text"),
            StageSpec("synth", "piper.synth", args={"model_path": str(voice.model), "config_path": str(voice.config),
                                                     "threads": 1, "sentence_silence_s": 0.2}),
            StageSpec("resample", "piper.resample", args={"sample_rate": rate}),
        ],
        edges=[
            EdgeSpec("text", "sentences", "synth"),
            EdgeSpec("synth", "pcm", "resample"),
            EdgeSpec("resample", "audio", OUT),
        ],
    )
    info = ModelInfo(id=voice.model_id, family="piper", speaks=True, voices=[voice.name], sample_rate=rate,
                     tasks=("speech",), applies_speed=True)
    return graph, info
