"""The Qwen3-Omni family: a checkpoint directory -> the stage graph that serves it, and its ModelInfo.

    preprocess --audio--> audio_encoder --embeds--> thinker --text--> (client)
        |      --image--> vision_encoder --embeds--^   |     (images, and videos' frames in temporal patches)
        |      --prompt-----------------------------^   +--hidden--> talker --codes--> code2wav --audio--> (client)
        +--grids (image grids, for the talker's M-RoPE)-------------------^

Variants: `speech` (default; text and audio out) and `text` (thinker only: the talker and
code2wav are neither in the graph nor loaded). Every stage loads only its own weights.

Options (all optional): `device`, `dtype` (e.g. "bfloat16"), `model_id`, `threads` (torch threads per
CPU stage process; default: the cores shared evenly, at least 1), `first_chunk_frames` /
`chunk_frames` (the vocoder's first and later chunk sizes), `stage_args` ({stage: {arg: value}},
merged last, e.g. engine sizes `{"thinker": {"num_blocks": 1024}}`). A checkpoint written by
`make_tiny` (it leaves `omni_tiny.json`) is flagged as random weights and gets short default
lengths: it says noise, and a random talker may never find its EOS. A directory written by
`presets_full` (config + tokenizer, `omni_random.json`, no weights) sets `load_format="random"` on
every model stage: each draws its weights on its own device (`random_load`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from omni.kernel.errors import GraphError
from omni.kernel.graph import Graph, StageSpec
from omni.stages.multimodal.graph import multimodal_edges
from omni.stages.multimodal.graph import settle_context as shared_settle
from omni.models.loading import random_marker, random_stage_args  # a config-only dir: random weights at load
from omni.models.registry import ModelInfo
from omni.layers.openai_voices import openai_voices
from omni.models.qwen3_omni.config import Qwen3OmniConfig, load_config
from omni.models.qwen3_omni.checkpoint.make_tiny import TINY_MARKER  # next to a random-weight checkpoint

FAMILY = "qwen3-omni"
VARIANTS = ("speech", "text")
DEFAULT_VOICE = "ethan"  # transformers' default speaker
# transformers' generate defaults: thinker_max_new_tokens 1024, talker_max_new_tokens 4096
DEFAULT_MAX_TOKENS = {"thinker": 1024, "talker": 4096}
TINY_MAX_TOKENS = {"thinker": 64, "talker": 256}

# one replica's memory and compute relative to the others, for `omnid serve --gpus` (placement.py):
# the 30B-A3B thinker dwarfs the 3B talker, which outweighs code2wav; the encoders are small
_LOADS = {"thinker": 8.0, "talker": 3.0, "code2wav": 2.0, "audio_encoder": 0.5, "vision_encoder": 0.5}

AUDIO_CACHE = {"cache_size": 4096, "cache_mb": 512}  # ~2.7 h of audio rows at the full size in bf16

_KINDS = {name: f"{FAMILY}.{name}" for name in  # registered by stages/__init__.py, with their args
          ("preprocess", "audio_encoder", "vision_encoder", "thinker", "talker", "code2wav")}


def voices_of(cfg: Qwen3OmniConfig) -> list[str]:
    """The talker's speakers, transformers' default first (the API's default voice is the first)."""
    if cfg.talker is None:
        return []
    names = sorted(cfg.talker.speaker_id)
    return sorted(names, key=lambda n: n != DEFAULT_VOICE)


def is_tiny(model_dir: str | Path) -> bool:
    return (Path(model_dir) / TINY_MARKER).is_file()


def build(model_dir: str | Path | None, variant: str | None = None, **options: Any) -> tuple[Graph, ModelInfo]:
    if model_dir is None:
        raise GraphError("the qwen3-omni family needs a checkpoint directory")
    model_dir = str(Path(model_dir).resolve())
    variant = variant or "speech"
    if variant not in VARIANTS:
        raise GraphError(f"unknown variant {variant!r} of {FAMILY}; variants: {', '.join(VARIANTS)}")
    cfg = load_config(model_dir)
    if variant == "speech" and cfg.talker is None:
        raise GraphError(f"{model_dir} has no talker / code2wav (no audio output); use variant 'text'")
    speaks = variant == "speech"
    tiny = is_tiny(model_dir)
    randomized = random_marker(model_dir)  # a presets_full dir: every stage draws random weights
    lengths = TINY_MAX_TOKENS if tiny or randomized else DEFAULT_MAX_TOKENS
    device, dtype = options.get("device", "cpu"), options.get("dtype")
    voices = voices_of(cfg) if speaks else []

    n_stages = 6 if speaks else 4
    threads = int(options.get("threads") or max(1, (os.cpu_count() or 1) // n_stages))

    def stage(name: str, args: dict[str, Any], **spec: Any) -> StageSpec:
        args = {**args, "threads": threads, **({"dtype": dtype} if dtype and name != "preprocess" else {}),
                **(random_stage_args(randomized) if name != "preprocess" else {}),
                **options.get("stage_args", {}).get(name, {})}
        return StageSpec(name, _KINDS[name], args=args, device="cpu" if name == "preprocess" else device,
                         load=_LOADS.get(name, 1.0), **spec)

    stages = [
        stage("preprocess", {"model_dir": model_dir, "voices": voices}),  # its prompt bound: settle()
        # a spoken conversation re-sends its earlier clips every turn: the cache encodes each once
        stage("audio_encoder", {"model_dir": model_dir, "out_port": "embeds", **AUDIO_CACHE}, capability="audio_input"),
        stage("vision_encoder", {"model_dir": model_dir, "out_port": "embeds"}, capability="image_input"),
        stage("thinker", {"model_dir": model_dir, "default_sampling": {"max_tokens": lengths["thinker"]}}),
    ]
    if speaks:
        stages += [
            stage("talker", {"model_dir": model_dir, "speaker": voices[0] if voices else DEFAULT_VOICE,
                             "default_sampling": {"max_tokens": lengths["talker"]}}, capability="audio_output"),
            stage("code2wav", {"model_dir": model_dir, "first_chunk_frames": options.get("first_chunk_frames", 4),
                               "chunk_frames": options.get("chunk_frames", 12)}, capability="audio_output"),
        ]
    graph = Graph(name=f"{FAMILY}-{variant}", stages=stages,
                  edges=multimodal_edges("thinker", "talker", "code2wav", speaks), entry="preprocess",
                  needs="omni.models.qwen3_omni.request:needs", media=["messages", "audio"])  # preprocess reads them
    graph.validate()
    info = ModelInfo(
        id=options.get("model_id") or Path(model_dir).name,
        family=FAMILY,
        speaks=speaks,
        transcribes=True,
        voices=voices,
        sample_rate=cfg.code2wav.sample_rate if cfg.code2wav is not None else 24000,
        random_weights=tiny or bool(randomized),
        sampling_stage="thinker",
        model_dir=model_dir,
        completions=True,
        logprobs=True,
        audio_input=True,
        default_max_tokens=lengths["thinker"],
        openai_voices=openai_voices(model_dir),
        audio_window=_audio_window(model_dir, cfg),
    )
    settle(graph, info)
    return graph, info


def settle(graph: Graph, info: ModelInfo) -> None:
    """The thinker's context bounds the prompts preprocess admits and is the model card's `max_context`."""
    shared_settle(graph, info, "thinker")


def _audio_window(model_dir: str, cfg: Qwen3OmniConfig) -> dict[str, int]:
    """16 kHz samples of one audio encoder attention window, and the samples past a frame's centre
    its log-mel needs: a Realtime session encodes a turn's windows while it is spoken (request.ENCODE)."""
    path = Path(model_dir) / "preprocessor_config.json"
    extra = json.loads(path.read_text()) if path.is_file() else {}
    audio, hop = cfg.thinker.audio, int(extra.get("hop_length", 160))
    chunk = 2 * audio.n_window
    return {"samples": max(1, audio.n_window_infer // chunk) * chunk * hop, "lead": int(extra.get("n_fft", 400)) // 2}

