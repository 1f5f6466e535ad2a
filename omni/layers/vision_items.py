"""`rope_windows_attention` and `PatchMerger`, blocks of the Qwen vision towers, and the encoder stage's view of a vision tower (Qwen3-Omni's, Qwen2.5-Omni's): items of patches in merge-block
order with their grid, checked against the tower's config (`in_channels`, `temporal_patch_size`,
`patch_size`, `spatial_merge_size`), one forward for a batch (images attend only to themselves: any
batch works), one output dict per item in the thinker's keys (`item_output`)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from omni.kernel.errors import InvalidRequest
from omni.layers.attention import sdpa
from omni.layers.norms import RMSNorm
from omni.layers.rotary import apply_rope


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
        return [self.item_output(o, grid, it) for o, grid, it in zip(self.model(pixels, grids), grids, items)]

    def item_output(self, out, grid: tuple[int, int, int], item: dict) -> dict:
        """{"<kind>_embeds", "<kind>_grid_thw"}; a video's item ({"kind": "video", "second_per_grid",
        "audio_tokens"}) adds `video_second_per_grid` [1] and `video_audio_tokens` [1] (the thinker's M-RoPE
        needs both)."""
        kind = item_kind(item)
        result = {f"{kind}_embeds": out, f"{kind}_grid_thw": np.asarray([grid], dtype=np.int64)}
        if kind == "video":
            result["video_second_per_grid"] = np.asarray([float(item.get("second_per_grid", 1.0))], dtype=np.float64)
            result["video_audio_tokens"] = np.asarray([int(item.get("audio_tokens", 0))], dtype=np.int64)
        return result


def item_kind(item: dict) -> str:
    return "video" if item.get("kind") == "video" else "image"


class PatchMerger(nn.Module):
    """Folds each merge block of a vision tower's rows into one token of the thinker's width: a norm (of
    each row, or with `norm_after_shuffle` of the block's rows together: Qwen3-Omni's deepstack mergers),
    then linear, GELU, linear. `rms`: an RMSNorm (Qwen2.5-VL's) instead of a LayerNorm (Qwen3-VL's)."""

    def __init__(self, hidden: int, merge: int, out: int, norm_after_shuffle: bool = False, rms: bool = False):
        super().__init__()
        self.width = hidden * merge**2
        self.norm_after_shuffle = norm_after_shuffle
        dim = self.width if norm_after_shuffle else hidden
        self.ln_q = RMSNorm(dim, 1e-6) if rms else nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.ModuleList([nn.Linear(self.width, self.width), nn.GELU(), nn.Linear(self.width, out)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln_q(x.reshape(-1, self.width)) if self.norm_after_shuffle else self.ln_q(x).reshape(-1, self.width)
        for layer in self.mlp:
            x = layer(x)
        return x


def rope_windows_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           sizes: list[int]) -> torch.Tensor:
    """A vision tower's attention: q/k/v [n, heads, hd] rotated in float32 (cos/sin [n, hd]), then each run
    of `sizes` rows (a frame, or a window) attending only to itself -> [n, heads * hd]."""
    n, heads, hd = q.shape
    q = apply_rope(q.float(), cos, sin).to(v.dtype)
    k = apply_rope(k.float(), cos, sin).to(v.dtype)
    outs, start = [], 0
    for size in sizes:  # one attention per run; padded batching is not worth it here
        sl = slice(start, start + size)
        o = sdpa(q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1))
        outs.append(o.transpose(0, 1).reshape(size, heads * hd))
        start += size
    return torch.cat(outs)
