"""Qwen3-Omni's `Preprocessor`: the shared one (omni/stages/multimodal/preprocess.py) with Qwen3-Omni's
numbers (its audio encoder's rows per 100-frame chunk, token ids, patch sizes) and its videos: decoded
by `omni.layers.video_frames` with this family's frame rule and patchified by `video_patches`."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from omni.stages.multimodal.preprocess import (AUDIO_TYPES, IMAGE_TYPES, SAMPLE_RATE, PromptSpec, PromptInputs, _audio_pcm,
                                         resample)
from omni.stages.multimodal.preprocess import Preprocessor as SharedPreprocessor
from omni.kernel.errors import InvalidRequest
from omni.layers.image_patches import ImagePatchConfig, smart_resize
from omni.stages.multimodal.preprocess import _read_preprocessor_config
from omni.models.qwen3_omni.config import load_config
from omni.models.qwen3_omni.modules.video_patches import (DEFAULT_FPS, VIDEO_MAX_PIXELS, VIDEO_MIN_PIXELS,
                                                          QwenFrameRule, VideoPatchConfig, VideoPatches,
                                                          video_to_patches)

__all__ = ["AUDIO_TYPES", "IMAGE_TYPES", "SAMPLE_RATE", "Preprocessor", "PromptInputs", "_audio_pcm",
           "audio_token_count", "resample"]


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
                      n_window_infer=t.audio.n_window_infer)


class Preprocessor(SharedPreprocessor):
    def __init__(self, ckpt_dir: str | Path):
        super().__init__(ckpt_dir, prompt_spec(ckpt_dir))
        self.audio_start_id = load_config(ckpt_dir).thinker.audio_start_token_id
        self.video_cfg = _video_config(self.image_cfg, _read_preprocessor_config(ckpt_dir))
        self.frame_rule = QwenFrameRule(self.video_cfg)

    def video_patches(self, video: bytes, fps: float | None = None) -> VideoPatches:
        """A video file's sampled frames as patches (an undecodable file is an InvalidRequest, and so
        is one whose tokens, counted before its frames are decoded, pass `max_video_tokens`); `fps`:
        the request's sampling rate instead of the checkpoint's (the processor's `fps` kwarg)."""
        from omni.layers.video_frames import VideoDecodeError, decode

        try:
            cfg = self.video_cfg if fps is None else replace(self.video_cfg, fps=float(fps))
            rule = self.frame_rule if fps is None else QwenFrameRule(cfg)
            clip = decode(bytes(video), rule, self._check_tokens if self.max_video_tokens else None)
        except VideoDecodeError as exc:
            raise InvalidRequest(f"cannot decode video: {exc}") from None
        return video_to_patches(clip.frames, cfg)

    def _check_tokens(self, frames: int, height: int, width: int) -> None:
        cfg = self.video_cfg
        if not height or not width:
            return  # the container does not say: the prompt's length bound holds after decoding
        h, w = smart_resize(height, width, cfg.patch_size * cfg.merge_size, cfg.min_pixels, cfg.max_pixels)
        grids = -(-frames // cfg.temporal_patch_size)
        tokens = grids * (h // cfg.patch_size) * (w // cfg.patch_size) // cfg.merge_size**2
        if tokens > self.max_video_tokens:
            raise InvalidRequest(f"the video makes {tokens} tokens ({frames} frames at {w}x{h}); the model's "
                                 f"context is {self.max_video_tokens} tokens")


def _video_config(image: ImagePatchConfig, extra: dict[str, Any]) -> VideoPatchConfig:
    """The video processor's settings: the checkpoint's `video_*` keys (else the processor's defaults)."""
    return VideoPatchConfig(
        patch_size=image.patch_size, merge_size=image.merge_size, temporal_patch_size=image.temporal_patch_size,
        min_pixels=int(extra.get("video_min_pixels", VIDEO_MIN_PIXELS)),
        max_pixels=int(extra.get("video_max_pixels", VIDEO_MAX_PIXELS)),
        image_mean=image.image_mean, image_std=image.image_std,
        fps=float(extra.get("video_fps", DEFAULT_FPS)),
        min_frames=int(extra.get("video_min_frames", 4)), max_frames=int(extra.get("video_max_frames", 768)))
