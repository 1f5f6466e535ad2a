"""The encoder stage's view of a vision tower (Qwen3-Omni's, Qwen2.5-Omni's): items of patches in merge-block
order with their grid, checked against the tower's config (`in_channels`, `temporal_patch_size`,
`patch_size`, `spatial_merge_size`), one forward for a batch (images attend only to themselves: any
batch works), one output dict per item in the thinker's keys (`item_output`)."""

from __future__ import annotations

import numpy as np
import torch

from omni.kernel.errors import InvalidRequest


class PatchItemsEncoder:
    """`BatchEncoder`. Item: {"pixels": [t*h*w, C*T*P*P] float32, "grid_thw": [t, h, w]}; output
    {"image_embeds": [tokens, out_hidden], "image_grid_thw": [1, 3]} (and what a subclass adds)."""

    def __init__(self, model) -> None:
        self.model = model

    def batch_key(self, item: dict) -> str:
        pixels, grid = item.get("pixels"), item.get("grid_thw")
        cfg = self.model.cfg
        width = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
        if pixels is None or grid is None or getattr(pixels, "ndim", 0) != 2 or pixels.shape[1] != width:
            raise InvalidRequest(f"image item needs pixels [patches, {width}] and grid_thw")
        t, h, w = (int(v) for v in np.asarray(grid).reshape(3))
        if pixels.shape[0] != t * h * w or h % cfg.spatial_merge_size or w % cfg.spatial_merge_size:
            raise InvalidRequest(f"pixels {list(pixels.shape)} do not fit grid {(t, h, w)}")
        return "image"

    def encode(self, items: list[dict]) -> list[dict]:
        device = next(self.model.parameters()).device
        pixels = [torch.as_tensor(np.asarray(it["pixels"], dtype=np.float32), device=device) for it in items]
        grids = [tuple(int(v) for v in np.asarray(it["grid_thw"]).reshape(3)) for it in items]
        return [self.item_output(o, grid) for o, grid in zip(self.model(pixels, grids), grids)]

    def item_output(self, out, grid: tuple[int, int, int]) -> dict:
        return {"image_embeds": out, "image_grid_thw": np.asarray([grid], dtype=np.int64)}
