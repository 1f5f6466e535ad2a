"""Images -> vision-encoder patches, as the Qwen2-VL image processor that Qwen3-Omni and Qwen2.5-Omni use does
(PIL + numpy only): RGB, resize so both sides are multiples of patch*merge within a pixel
budget, rescale and normalise, then flatten patches in spatial-merge-block order.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np

from omni.kernel.errors import InvalidRequest


@dataclass(frozen=True)
class ImagePatchConfig:
    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)


@dataclass
class ImagePatches:
    pixels: np.ndarray  # [grid_h * grid_w, 3 * temporal * patch * patch] float32
    grid_thw: tuple[int, int, int]

    def num_tokens(self, merge_size: int) -> int:
        t, h, w = self.grid_thw
        return t * h * w // (merge_size * merge_size)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Nearest size with both sides multiples of `factor` and area within [min, max] pixels."""
    if min(height, width) < 1 or max(height, width) / min(height, width) > 200:
        raise InvalidRequest(f"image of {width}x{height} has an unsupported aspect ratio")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def to_rgb_image(image):
    """Encoded bytes, a PIL image or a uint8 array (H, W[, 3|4]) -> an RGB PIL image
    (transparent pixels composited on white, as transformers does)."""
    from PIL import Image

    if isinstance(image, (bytes, bytearray, memoryview)):
        try:
            image = Image.open(io.BytesIO(bytes(image)))
            image.load()
        except Exception as exc:
            raise InvalidRequest(f"cannot decode image: {exc}") from None
    elif isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3):
            raise InvalidRequest(f"image arrays must be uint8 [H, W(, C)], got {image.dtype} {image.shape}")
        return Image.fromarray(image).convert("RGB") if image.ndim == 2 or image.shape[-1] == 3 else \
            _on_white(Image.fromarray(image))
    elif not isinstance(image, Image.Image):
        raise InvalidRequest(f"unsupported image input {type(image).__name__}")
    if image.mode == "RGB":
        return image
    return _on_white(image)


def _on_white(image):
    from PIL import Image

    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def image_to_patches(image, cfg: ImagePatchConfig) -> ImagePatches:
    from PIL import Image

    rgb = to_rgb_image(image)
    width, height = rgb.size
    factor = cfg.patch_size * cfg.merge_size
    new_h, new_w = smart_resize(height, width, factor, cfg.min_pixels, cfg.max_pixels)
    resized = np.asarray(rgb.resize((new_w, new_h), resample=Image.Resampling.BICUBIC))
    chw = np.moveaxis(resized, -1, 0)
    x = (chw.astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.asarray(cfg.image_mean, dtype=np.float32)[:, None, None]
    std = np.asarray(cfg.image_std, dtype=np.float32)[:, None, None]
    x = (x - mean) / std
    return _patchify(x, cfg)


def _patchify(x: np.ndarray, cfg: ImagePatchConfig) -> ImagePatches:
    """[C, H, W] -> patches in merge-block order, each repeated over the temporal patch."""
    c, h, w = x.shape
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gh, gw = h // p, w // p
    blocks = x.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    blocks = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], t, p, p))
    return ImagePatches(np.ascontiguousarray(blocks.reshape(gh * gw, c * t * p * p)), (1, gh, gw))


def block_order_rows_cols(h: int, w: int, merge: int):
    """(row, col) of every patch of an h x w grid, listed block by block (merge x merge): the order
    `image_to_patches` lists patches in, and the vision encoders' positions."""
    import torch

    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    return rows.reshape(shape).transpose(1, 2).flatten(), cols.reshape(shape).transpose(1, 2).flatten()
