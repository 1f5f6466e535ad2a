"""Qwen3-Omni's `Preprocessor`: the shared one (omni/stages/multimodal/preprocess.py) with Qwen3-Omni's
numbers (its audio encoder's rows per 100-frame chunk, token ids, patch sizes) and its videos: decoded
by `omni.layers.video_frames` and patchified by `omni.layers.video_patches` within its processor's pixel
budget."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from omni.stages.multimodal.preprocess import (AUDIO_TYPES, IMAGE_TYPES, SAMPLE_RATE, PromptSpec, PromptInputs, _audio_pcm,
                                         resample)
from omni.stages.multimodal.preprocess import Preprocessor as SharedPreprocessor
from omni.models.qwen3_omni.config import load_config

__all__ = ["AUDIO_TYPES", "IMAGE_TYPES", "SAMPLE_RATE", "Preprocessor", "PromptInputs", "_audio_pcm",
           "audio_token_count", "resample"]


VIDEO_PIXELS = (128 * 32 * 32, 768 * 32 * 32)  # Qwen3OmniMoeProcessor's videos_kwargs size


def audio_token_count(num_frames: int, n_window: int = 50) -> int:
    """Tokens the audio encoder outputs for `num_frames` mel frames (chunks of 2*n_window
    frames each give 13 for n_window 50; the tail chunk goes through three stride-2 convs)."""
    chunk = 2 * n_window
    tail = num_frames % chunk
    n = (tail - 1) // 2 + 1
    n = (n - 1) // 2 + 1
    n = (n - 1) // 2 + 1
    full = (chunk - 1) // 2 + 1
    full = ((full - 1) // 2 + 1 - 1) // 2 + 1
    return n + (num_frames // chunk) * full if tail else (num_frames // chunk) * full


def prompt_spec(ckpt_dir: str | Path) -> PromptSpec:
    t = load_config(ckpt_dir).thinker
    return PromptSpec(vocab_size=t.text.vocab_size, audio_token_id=t.audio_token_id, image_token_id=t.image_token_id,
                      video_token_id=t.video_token_id, num_mel_bins=t.audio.num_mel_bins,
                      audio_tokens=partial(audio_token_count, n_window=t.audio.n_window),
                      patch_size=t.vision.patch_size, spatial_merge_size=t.vision.spatial_merge_size,
                      temporal_patch_size=t.vision.temporal_patch_size, n_window=t.audio.n_window,
                      n_window_infer=t.audio.n_window_infer, video_pixels=VIDEO_PIXELS)


class Preprocessor(SharedPreprocessor):
    def __init__(self, ckpt_dir: str | Path):
        super().__init__(ckpt_dir, prompt_spec(ckpt_dir))
        self.audio_start_id = load_config(ckpt_dir).thinker.audio_start_token_id
