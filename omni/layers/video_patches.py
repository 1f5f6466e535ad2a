"""Video frames -> vision-encoder patches, as transformers' `Qwen2VLVideoProcessor` makes them (the video
processor of Qwen3-Omni and of Qwen2.5-Omni, whose processors call it with `fps` and `do_sample_frames=True`;
each family gives its own pixel budget and patch size):
- frames (`FpsFrameRule.indices`, its `sample_frames`): `total / video_fps * fps` frames,
  clamped to [min_frames, min(max_frames, total) floored to the temporal patch], floored to a
  multiple of the temporal patch, taken at `arange(0, total, total / n).int()`;
- size: `smart_resize` of the frame to multiples of patch*merge within [min, max] pixels, resized
  by torchvision's `resize` (bicubic, antialias; on the CPU, uint8 in and out), then rescaled and
  normalised in one step as transformers fuses them (`(x - 255 mean) / (255 std)` in float32);
- patches: frames padded to a multiple of the temporal patch with the last frame, then flattened
  per (t, merge block, patch) like an image's, the temporal patch inside each row;
- the processor's `video_second_per_grid` = temporal_patch_size / fps (the seconds-per-grid rule
  behind the temporal M-RoPE positions, `omni.layers.mrope_index`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from omni.kernel.errors import InvalidRequest
from omni.layers.image_patches import smart_resize

DEFAULT_FPS = 2.0  # what Qwen's own video loader (qwen-omni-utils) samples at, and both processors assume


@dataclass(frozen=True)
class VideoPatchConfig:
    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 128 * 32 * 32  # the family's processor's videos_kwargs size
    max_pixels: int = 768 * 32 * 32
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    fps: float = DEFAULT_FPS
    min_frames: int = 4
    max_frames: int = 768


@dataclass(frozen=True)
class FpsFrameRule:
    """`Qwen2VLVideoProcessor.sample_frames` with `fps` (a `video_frames.FrameRule`)."""

    cfg: VideoPatchConfig

    def indices(self, total_frames: int, fps: float) -> list[int]:
        import torch

        tps, cfg = self.cfg.temporal_patch_size, self.cfg
        max_frames = math.floor(min(cfg.max_frames, total_frames) / tps) * tps
        n = total_frames / fps * cfg.fps
        n = min(max(n, cfg.min_frames), max_frames, total_frames)
        n = math.floor(n / tps) * tps
        if n <= 0:
            raise InvalidRequest(f"the video has {total_frames} frame(s); at least {tps} are needed")
        return torch.arange(0, total_frames, total_frames / n).int().tolist()

    def frame(self, rgb: np.ndarray) -> np.ndarray:
        """One decoded frame resized as `video_to_patches` resizes a stack (each frame on its own:
        the same bytes), so that only resized frames are held."""
        import torch

        video = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1)[None].contiguous()
        return _resized(video, self.cfg)[0].permute(1, 2, 0).numpy()


@dataclass
class VideoPatches:
    pixels: np.ndarray  # [t * h * w, 3 * temporal * patch * patch] float32
    grid_thw: tuple[int, int, int]
    second_per_grid: float

    def num_tokens(self, merge_size: int) -> int:
        t, h, w = self.grid_thw
        return t * h * w // (merge_size * merge_size)


def video_to_patches(frames: np.ndarray, cfg: VideoPatchConfig) -> VideoPatches:
    """frames: uint8 [n, H, W, 3] RGB (the sampled frames)."""
    import torch

    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or not len(frames):
        raise InvalidRequest(f"video frames must be uint8 [n, H, W, 3], got {frames.dtype} {frames.shape}")
    video = _resized(torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).contiguous(), cfg)
    mean = torch.tensor(cfg.image_mean) * (1.0 / (1 / 255))
    std = torch.tensor(cfg.image_std) * (1.0 / (1 / 255))
    x = video.to(torch.float32).sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))
    return _patchify(x, cfg, cfg.temporal_patch_size / cfg.fps)


def _resized(video, cfg: VideoPatchConfig):
    """uint8 [n, C, H, W] at the processor's size (`smart_resize`; already there: as it is)."""
    import torch.nn.functional as F

    height, width = video.shape[-2:]
    new_h, new_w = smart_resize(height, width, cfg.patch_size * cfg.merge_size, cfg.min_pixels, cfg.max_pixels)
    if (new_h, new_w) == (height, width):
        return video
    # torchvision's resize: on the CPU, native uint8 bicubic with antialias
    return F.interpolate(video, size=[new_h, new_w], mode="bicubic", align_corners=False, antialias=True)


def _patchify(x, cfg: VideoPatchConfig, second_per_grid: float) -> VideoPatches:
    """[n, C, H, W] -> rows in (t, merge block, patch) order, as `Qwen2VLVideoProcessor.patchify`."""
    import torch

    n, c, h, w = x.shape
    p, m, tp = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    if pad := -n % tp:
        x = torch.cat([x, x[-1:].expand(pad, -1, -1, -1)])
        n += pad
    gt, gh, gw = n // tp, h // p, w // p
    patches = x.view(gt, tp, c, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    rows = patches.reshape(gt * gh * gw, c * tp * p * p)
    return VideoPatches(np.ascontiguousarray(rows.numpy()), (gt, gh, gw), float(second_per_grid))
