"""Qwen2.5-Omni's vision encoder (Qwen2.5-VL's, weights under `thinker.visual.`) in omni's code.

Patches arrive in spatial-merge-block order (omni/layers/image_patches.py) and get 2-D rotary
positions (row, column). They are regrouped window by window (windows of `window_size` pixels, in
merge blocks); most blocks attend within a window, the `fullatt_block_indexes` within a whole frame.
The merger folds each merge block into one token of the thinker's width, and the tokens return to
the block order. A video is t such frames (each grid step `temporal_patch_size` frames deep in the patch
embedding): windows and full attention stay within one frame step, as Qwen2.5-VL's do.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from omni.layers.image_patches import block_order_rows_cols
from omni.layers.mlp import GatedMLP
from omni.layers.norms import RMSNorm
from omni.layers.rotary import cos_sin, rope_inv_freq
from omni.layers.vision_items import PatchItemsEncoder, PatchMerger, rope_windows_attention
from omni.models.qwen2_5_omni.config import VisionEncoderConfig, load_omni_config
from omni.models.weights import load_module

PREFIX = "thinker.visual"


def window_order(grid: tuple[int, int, int], merge: int, window: int) -> tuple[torch.Tensor, list[int]]:
    """The merge blocks of one image listed window by window, and each window's block count."""
    t, h, w = grid
    gh, gw = h // merge, w // merge
    index = torch.arange(t * gh * gw).reshape(t, gh, gw)
    pad_h, pad_w = window - gh % window, window - gw % window
    nh, nw = (gh + pad_h) // window, (gw + pad_w) // window
    padded = F.pad(index, (0, pad_w, 0, pad_h), value=-100).reshape(t, nh, window, nw, window)
    padded = padded.permute(0, 1, 3, 2, 4).reshape(t, nh * nw, window * window)
    sizes = (padded != -100).sum(-1).reshape(-1).tolist()
    flat = padded.reshape(-1)
    return flat[flat != -100], [s for s in sizes if s]


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionEncoderConfig):
        super().__init__()
        self.heads = cfg.num_heads
        d = cfg.hidden_size
        self.norm1, self.norm2 = RMSNorm(d, 1e-6), RMSNorm(d, 1e-6)
        self.attn = nn.Module()
        for name in ("q", "k", "v", "proj"):
            setattr(self.attn, name, nn.Linear(d, d))
        self.mlp = GatedMLP(d, cfg.intermediate_size, cfg.hidden_act, bias=True)

    def forward(self, x, cos, sin, sizes: list[int]) -> torch.Tensor:
        x = x + self._attention(self.norm1(x), cos, sin, sizes)
        return x + self.mlp(self.norm2(x))

    def _attention(self, x, cos, sin, sizes: list[int]) -> torch.Tensor:
        n, d = x.shape
        q, k, v = (getattr(self.attn, name)(x).view(n, self.heads, d // self.heads) for name in ("q", "k", "v"))
        return self.attn.proj(rope_windows_attention(q, k, v, cos, sin, sizes))


class VisionEncoder(nn.Module):
    def __init__(self, cfg: VisionEncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Module()
        k = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.patch_embed.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel_size=k, stride=k, bias=False)
        self.blocks = nn.ModuleList([VisionBlock(cfg) for _ in range(cfg.depth)])
        self.merger = PatchMerger(cfg.hidden_size, cfg.spatial_merge_size, cfg.out_hidden_size, rms=True)
        head_dim = cfg.hidden_size // cfg.num_heads
        self.register_buffer("inv_freq", rope_inv_freq(head_dim // 2, cfg.rope_theta), persistent=False)

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path, dtype=None, device: str = "cpu") -> "VisionEncoder":
        return load_module(lambda: cls(load_omni_config(ckpt_dir).thinker.vision), ckpt_dir, PREFIX, dtype, device)

    @torch.inference_mode()
    def forward(self, pixels: list[torch.Tensor], grids: list[tuple[int, int, int]]) -> list[torch.Tensor]:
        """pixels[i]: [t*h*w, C*T*P*P] patches of image i (block order); grids[i] = (t, h, w) ->
        [t*h*w / merge^2, out_hidden_size] per image."""
        if len(pixels) != len(grids) or not pixels:
            raise ValueError("one (t, h, w) grid per image is needed")
        cfg, m = self.cfg, self.cfg.spatial_merge_size
        unit = m * m
        for p, (t, h, w) in zip(pixels, grids):
            if p.shape[0] != t * h * w or h % m or w % m:
                raise ValueError(f"patches {tuple(p.shape)} do not fit grid {(t, h, w)} with merge {m}")
        proj = self.patch_embed.proj
        x = F.linear(torch.cat(pixels).to(proj.weight.dtype), proj.weight.reshape(proj.out_channels, -1))
        order, windows, frames, offset = [], [], [], 0
        for t, h, w in grids:
            idx, sizes = window_order((t, h, w), m, cfg.window_size // m // cfg.patch_size)
            order.append(idx + offset)
            windows += [s * unit for s in sizes]
            frames += [h * w] * t
            offset += t * h * w // unit
        order = torch.cat(order).to(x.device)
        rows, cols = [], []
        for t, h, w in grids:
            r, c = block_order_rows_cols(h, w, m)
            rows.append(r.repeat(t))
            cols.append(c.repeat(t))
        angles = torch.cat([torch.cat(rows)[:, None].float() * self.inv_freq.cpu(),
                            torch.cat(cols)[:, None].float() * self.inv_freq.cpu()], dim=-1)
        cos, sin = (c.to(x.device) for c in cos_sin(angles, torch.float32))
        permute = lambda t: t.reshape(-1, unit, t.shape[-1])[order].reshape(-1, t.shape[-1])  # noqa: E731
        x, cos, sin = permute(x), permute(cos), permute(sin)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, frames if i in cfg.fullatt_block_indexes else windows)
        merged = self.merger(x)[torch.argsort(order)]
        return list(merged.split([t * h * w // unit for t, h, w in grids]))


class ImagePatchesEncoder(PatchItemsEncoder):
    """The encoder stage's `BatchEncoder` (omni/layers/vision_items.py): {"image_embeds", "image_grid_thw"}, or
    for a video's item (its frames' patches, t grids of `temporal_patch_size` frames) the `video_` keys with
    its seconds per grid and audio tokens."""
