"""The Qwen3-TTS family: a checkpoint directory -> the stage graph that serves it, and its ModelInfo.

    CustomVoice / VoiceDesign:  preprocess --prompt--> talker --codes--> codec --audio--> (client)
    Base (voice cloning):       preprocess --prompt--> talker --codes--> codec --audio--> (client)
                                    +------voice--> voice --voice--^

The kind comes from config.json (`tts_model_type`). `voice` (h16b) turns a named uploaded voice
or an inline clip into the speaker embedding and reference codes, cached; `codec` (h16b) is the
12 Hz speech tokenizer's decoder, streaming audio as frames arrive.

Options (all optional): `device`, `dtype`, `model_id`, `threads`, `first_chunk_frames` /
`chunk_frames` / `grow_chunks` (the codec's first and later chunk sizes, default 1 and 12,
growing in between: the first one sets the time to first audio), `stage_args` ({stage: {arg:
value}}, merged last). Sampling defaults come from the checkpoint's generation_config.json (as
the reference's `generate_*` read it). A checkpoint
written by `make_tiny` (it leaves `omni_tiny.json`) is flagged as random weights and gets a short
default length: a random talker may never find its codec EOS.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from omni.kernel.errors import GraphError
from omni.kernel.graph import OUT, EdgeSpec, Graph, StageSpec
from omni.models.registry import ModelInfo
from omni.layers.openai_voices import openai_voices
from omni.models.qwen3_tts.config import TINY_MARKER, load_config

FAMILY = "qwen3-tts"
KINDS = {name: f"{FAMILY}.{name}" for name in ("preprocess", "voice", "talker", "codec")}  # registered in __init__.py
# what a stage serves alone (the kernel's routing skips the stages a request does not need)
CAPABILITIES = {"voice": "voice_clone", "talker": "speech", "codec": "speech"}
TINY_MAX_TOKENS = 64
DEFAULT_MAX_TOKENS = 8192  # the published generation_config's max_new_tokens
# The 12 Hz decoder has no lookahead (T frames are exactly T * 1920 final samples), so the first
# audio can leave after one frame (83 ms of audio); later chunks grow 1, 2, 4, 8 up to 12 frames
# (each as long as the audio already sent), where batching and per-forward cost pay off.
FIRST_CHUNK_FRAMES, CHUNK_FRAMES = 1, 12


def talker_sampling(model_dir: str | Path, tiny: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """generation_config.json -> (the talker's default sampling, the code predictor's settings)."""
    path = Path(model_dir) / "generation_config.json"
    gen = json.loads(path.read_text()) if path.is_file() else {}
    greedy = gen.get("do_sample", True) is False
    sampling = {"temperature": 0.0 if greedy else float(gen.get("temperature", 0.9)),
                "top_k": int(gen.get("top_k", 50)), "top_p": float(gen.get("top_p", 1.0)),
                "repetition_penalty": float(gen.get("repetition_penalty", 1.05)),
                "max_tokens": TINY_MAX_TOKENS if tiny else int(gen.get("max_new_tokens", DEFAULT_MAX_TOKENS))}
    sub_greedy = gen.get("subtalker_dosample", True) is False
    predictor = {"predictor_temperature": 0.0 if sub_greedy else float(gen.get("subtalker_temperature", 0.9)),
                 "predictor_top_k": int(gen.get("subtalker_top_k", 50)),
                 "predictor_top_p": float(gen.get("subtalker_top_p", 1.0))}
    return sampling, predictor


def sample_rate_of(model_dir: str | Path) -> int:
    path = Path(model_dir) / "speech_tokenizer" / "config.json"
    try:
        return int(json.loads(path.read_text()).get("output_sample_rate", 24000))
    except (OSError, ValueError):
        return 24000


def needs(params: dict[str, Any]) -> set[str]:
    return {"speech"}


def needs_base(params: dict[str, Any]) -> set[str]:
    """A voice-creation request (task "voice") runs the voice stage only; speech runs everything."""
    return {"voice_clone"} if params.get("task") == "voice" else {"speech", "voice_clone"}


def build(model_dir: str | Path | None, variant: str | None = None, **options: Any) -> tuple[Graph, ModelInfo]:
    if model_dir is None:
        raise GraphError("the qwen3-tts family needs a checkpoint directory")
    if variant not in (None, "speech"):
        raise GraphError(f"unknown variant {variant!r} of {FAMILY}; variants: speech")
    model_dir = str(Path(model_dir).resolve())
    cfg = load_config(model_dir)
    tiny = (Path(model_dir) / TINY_MARKER).is_file()
    base = cfg.kind == "base"
    device, dtype = options.get("device", "cpu"), options.get("dtype")
    threads = int(options.get("threads") or max(1, (os.cpu_count() or 1) // (4 if base else 3)))
    sampling, predictor = talker_sampling(model_dir, tiny)

    def stage(name: str, args: dict[str, Any], media: bool = False) -> StageSpec:
        args = {"model_dir": model_dir, **args, "threads": threads,
                **({"dtype": dtype} if dtype and name != "preprocess" else {}),
                **options.get("stage_args", {}).get(name, {})}
        return StageSpec(name, KINDS[name], args=args, device="cpu" if name == "preprocess" else device,
                         capability=CAPABILITIES.get(name, ""), media=media)

    stages = [
        stage("preprocess", {}),
        stage("talker", {"default_sampling": sampling, **predictor}),
        stage("codec", {"first_chunk_frames": options.get("first_chunk_frames", FIRST_CHUNK_FRAMES),
                        "chunk_frames": options.get("chunk_frames", CHUNK_FRAMES),
                        "grow_chunks": bool(options.get("grow_chunks", True))}),
    ]
    edges = [
        EdgeSpec("preprocess", "prompt", "talker", "prompt"),
        EdgeSpec("talker", "codes", "codec"),
        EdgeSpec("codec", "audio", OUT),
    ]
    if base:
        stages.insert(1, stage("voice", {}, media=True))  # it reads the clip (voice_ref) or the voice (voice_prompt)
        edges += [EdgeSpec("preprocess", "voice", "voice", "voice"), EdgeSpec("voice", "voice", "talker", "voice"),
                  EdgeSpec("voice", "voice_prompt", OUT)]  # a voice's embedding + codes, for POST /v1/audio/voices
    graph = Graph(name=f"{FAMILY}-{cfg.kind}", stages=stages, edges=edges, entry="preprocess",
                  needs="omni.models.qwen3_tts.graph:needs_base" if base else "omni.models.qwen3_tts.graph:needs",
                  media=["voice_ref", "voice_prompt"])
    graph.validate()
    info = ModelInfo(
        id=options.get("model_id") or Path(model_dir).name,
        family=FAMILY,
        speaks=True,
        voices=cfg.voices if cfg.kind == "custom_voice" else [],
        sample_rate=sample_rate_of(model_dir),
        random_weights=tiny,
        model_dir=model_dir,
        tasks=("speech",),
        instructions=cfg.kind != "base",
        designs_voices=cfg.kind == "voice_design",
        clones_voices=base,
        speaker_sample_rate=24000,
        openai_voices=openai_voices(model_dir),
    )
    return graph, info
