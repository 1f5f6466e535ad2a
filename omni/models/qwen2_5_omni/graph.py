"""The Qwen2.5-Omni family: a checkpoint directory -> the stage graph that serves it, and its ModelInfo.

    preprocess --audio--> audio_encoder --embeds--> thinker --text--> (client)
        |      --image--> vision_encoder --embeds--^   |
        |      --prompt-----------------------------^   +--hidden--> talker --codes--> token2wav --audio--> (client)

Port `image` carries images and videos (a video's frames as patches, with its seconds per grid).
Variants: `speech` (default when the checkpoint has a talker and token2wav: text and audio out) and
`text` (thinker only: the talker and token2wav are neither in the graph nor loaded). Every stage loads
only its own weights. Options as Qwen3-Omni's graph takes them: `device`, `dtype`, `model_id`,
`threads`, `stage_args` ({stage: {arg: value}}, merged last). A checkpoint written by make_tiny
(`omni_tiny.json`) is flagged as random weights and gets short default lengths. So does a
config-only directory (`omni_random.json`: make_tiny's `full-7b` or `--config-only`), whose every
model stage also gets `load_format="random"` and draws its weights on its own device (random_load.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omni.kernel.errors import GraphError
from omni.kernel.graph import Graph, StageSpec
from omni.stages.multimodal.graph import multimodal_edges
from omni.stages.multimodal.graph import settle_context as shared_settle
from omni.models.loading import random_marker, random_stage_args
from omni.models.qwen2_5_omni.checkpoint.tiny_presets import TINY_MARKER
from omni.models.qwen2_5_omni.config import SPEAKERS_FILE, load_omni_config
from omni.models.registry import ModelInfo

FAMILY = "qwen2.5-omni"
VARIANTS = ("speech", "text")
DEFAULT_VOICE = "chelsie"  # transformers' default speaker
DEFAULT_MAX_TOKENS = {"thinker": 1024, "talker": 4096}  # transformers' generate defaults
TINY_MAX_TOKENS = {"thinker": 64, "talker": 256}
_LOADS = {"thinker": 8.0, "talker": 2.0, "token2wav": 2.0, "audio_encoder": 0.5, "vision_encoder": 0.5}
_KINDS = {name: f"{FAMILY}.{name}" for name in
          ("preprocess", "audio_encoder", "vision_encoder", "thinker", "talker", "token2wav")}


def voices_of(model_dir: str | Path) -> list[str]:
    """The speakers of `spk_dict.pt`, lower-cased, transformers' default first."""
    import torch

    path = Path(model_dir) / SPEAKERS_FILE
    if not path.is_file():
        return []
    names = sorted(str(n).lower() for n in torch.load(path, map_location="cpu", weights_only=True))
    return sorted(names, key=lambda n: n != DEFAULT_VOICE)


def build(model_dir: str | Path | None, variant: str | None = None, **options: Any) -> tuple[Graph, ModelInfo]:
    if model_dir is None:
        raise GraphError("the qwen2.5-omni family needs a checkpoint directory")
    model_dir = str(Path(model_dir).resolve())
    cfg = load_omni_config(model_dir)
    can_speak = cfg.talker is not None and bool(voices_of(model_dir))
    variant = variant or ("speech" if can_speak else "text")
    if variant not in VARIANTS:
        raise GraphError(f"unknown variant {variant!r} of {FAMILY}; variants: {', '.join(VARIANTS)}")
    if variant == "speech" and not can_speak:
        raise GraphError(f"{model_dir}: no audio output here (no talker / token2wav / speakers); use variant 'text'")
    speaks = variant == "speech"
    drawn = random_marker(model_dir)  # config only: every model stage draws its weights
    random = (Path(model_dir) / TINY_MARKER).is_file() or drawn is not None
    lengths = TINY_MAX_TOKENS if random else DEFAULT_MAX_TOKENS
    device, dtype = options.get("device", "cpu"), options.get("dtype")
    voices = voices_of(model_dir) if speaks else []
    threads = int(options.get("threads") or max(1, (os.cpu_count() or 1) // (6 if speaks else 4)))

    def stage(name: str, args: dict[str, Any], **spec: Any) -> StageSpec:
        model = name != "preprocess"
        args = {**args, "threads": threads, **({"dtype": dtype} if dtype and model and name != "token2wav" else {}),
                **(random_stage_args(drawn) if model else {}), **options.get("stage_args", {}).get(name, {})}
        return StageSpec(name, _KINDS[name], args=args, device="cpu" if name == "preprocess" else device,
                         load=_LOADS.get(name, 1.0), **spec)

    stages = [
        stage("preprocess", {"model_dir": model_dir, "voices": voices}),
        stage("audio_encoder", {"model_dir": model_dir, "out_port": "embeds"}, capability="audio_input"),
        stage("vision_encoder", {"model_dir": model_dir, "out_port": "embeds"}, capability="image_input"),
        stage("thinker", {"model_dir": model_dir, "default_sampling": {"max_tokens": lengths["thinker"]}}),
    ]
    if speaks:
        stages += [
            stage("talker", {"model_dir": model_dir, "speaker": voices[0],
                             "default_sampling": {"max_tokens": lengths["talker"]}}, capability="audio_output"),
            stage("token2wav", {"model_dir": model_dir, **({"dit_dtype": dtype} if dtype and str(device).startswith("cuda")
                                                           else {})}, capability="audio_output"),
        ]
    graph = Graph(name=f"{FAMILY}-{variant}", stages=stages,
                  edges=multimodal_edges("thinker", "talker", "token2wav", speaks), entry="preprocess",
                  needs="omni.stages.multimodal.request:needs", media=["messages", "audio"])
    graph.validate()
    info = ModelInfo(
        id=options.get("model_id") or Path(model_dir).name, family=FAMILY, speaks=speaks, transcribes=True,
        voices=voices, sample_rate=cfg.token2wav.sample_rate if cfg.token2wav is not None else 24000,
        random_weights=random, sampling_stage="thinker", model_dir=model_dir, completions=True, logprobs=True,
        audio_input=True, default_max_tokens=lengths["thinker"],
    )
    settle(graph, info)
    return graph, info


def settle(graph: Graph, info: ModelInfo) -> None:
    """The thinker's context bounds the prompts preprocess admits and is the model card's `max_context`."""
    shared_settle(graph, info, "thinker")
