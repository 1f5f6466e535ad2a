"""Qwen3-Omni's vision encoder (weights under `thinker.visual.`) in omni's code.

Patches arrive in spatial-merge-block order (see image_patches). Each patch gets a learned
position embedding resampled bilinearly (align_corners) from a square table to the image's
grid, plus 2-D rotary positions; attention stays within one frame of one image. The merger
folds each 2x2 block into one token of the thinker's width; `deepstack` layers also emit
merged features that the thinker adds to its first layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from omni.layers.mlp import MLP
from omni.layers.rotary import cos_sin, rope_inv_freq
from omni.layers.image_patches import block_order_rows_cols
from omni.layers.vision_items import PatchItemsEncoder, PatchMerger, item_kind, rope_windows_attention
from omni.models.qwen3_omni.config import VisionEncoderConfig, load_config
from omni.models.weights import load_module

PREFIX = "thinker.visual"


@dataclass
class VisionOutput:
    embeds: torch.Tensor  # [tokens, out_hidden_size] for one image
    deepstack: list[torch.Tensor]  # one [tokens, out_hidden_size] per deepstack layer


def vision_inv_freq(cfg: VisionEncoderConfig, device=None) -> torch.Tensor:
    """2-D rope: half of each head's rotary dims for the row, half for the column."""
    theta = float((cfg.raw.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    return rope_inv_freq(cfg.hidden_size // cfg.num_heads // 2, theta, device)


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionEncoderConfig):
        super().__init__()
        self.heads = cfg.num_heads
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.attn.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_size, cfg.hidden_act)

    def forward(self, x, cos, sin, sizes: list[int]) -> torch.Tensor:
        x = x + self._attention(self.norm1(x), cos, sin, sizes)
        return x + self.mlp(self.norm2(x))

    def _attention(self, x, cos, sin, sizes: list[int]) -> torch.Tensor:
        n, d = x.shape
        q, k, v = self.attn.qkv(x).view(n, 3, self.heads, d // self.heads).unbind(1)
        return self.attn.proj(rope_windows_attention(q, k, v, cos, sin, sizes))


class VisionEncoder(nn.Module):
    def __init__(self, cfg: VisionEncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Module()
        k = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.patch_embed.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel_size=k, stride=k)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.side = int(cfg.num_position_embeddings**0.5)
        self.blocks = nn.ModuleList([VisionBlock(cfg) for _ in range(cfg.depth)])
        self.merger = PatchMerger(cfg.hidden_size, cfg.spatial_merge_size, cfg.out_hidden_size)
        self.merger_list = nn.ModuleList([PatchMerger(cfg.hidden_size, cfg.spatial_merge_size, cfg.out_hidden_size, True)
                                           for _ in cfg.deepstack_visual_indexes])
        self.register_buffer("inv_freq", vision_inv_freq(cfg), persistent=False)

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path, dtype=None, device: str = "cpu") -> "VisionEncoder":
        return load_module(lambda: cls(load_config(ckpt_dir).thinker.vision), ckpt_dir, PREFIX, dtype, device)

    @torch.inference_mode()
    def forward(self, pixels: list[torch.Tensor], grids: list[tuple[int, int, int]]) -> list[VisionOutput]:
        """pixels[i]: [t*h*w, C*T*P*P] patches of image i (block order); grids[i] = (t, h, w)."""
        if len(pixels) != len(grids) or not pixels:
            raise ValueError("one (t, h, w) grid per image is needed")
        m = self.cfg.spatial_merge_size
        for p, (t, h, w) in zip(pixels, grids):
            if p.shape[0] != t * h * w or h % m or w % m:
                raise ValueError(f"patches {tuple(p.shape)} do not fit grid {(t, h, w)} with merge {m}")
        proj = self.patch_embed.proj
        x = torch.cat(pixels).to(proj.weight.dtype)
        x = F.linear(x, proj.weight.reshape(proj.out_channels, -1), proj.bias)
        pos, cos, sin = self._positions(grids, x.device)
        x = x + pos.to(x.dtype)
        sizes = [h * w for t, h, w in grids for _ in range(t)]
        deep = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, sizes)
            if i in self.cfg.deepstack_visual_indexes:
                deep.append(self.merger_list[self.cfg.deepstack_visual_indexes.index(i)](x))
        merged = self.merger(x)
        counts = [t * h * w // (m * m) for t, h, w in grids]
        per_image = list(merged.split(counts))
        deep_split = [d.split(counts) for d in deep]
        return [VisionOutput(per_image[i], [d[i] for d in deep_split]) for i in range(len(grids))]

    def _positions(self, grids, device):
        """Learned (bilinearly resampled) position embeddings and rotary cos/sin, per patch."""
        embeds, rows_all, cols_all = [], [], []
        s = self.side
        for t, h, w in grids:
            rows, cols = (a.to(device) for a in block_order_rows_cols(h, w, self.cfg.spatial_merge_size))
            y = rows.float() * (s - 1) / max(h - 1, 1)
            xx = cols.float() * (s - 1) / max(w - 1, 1)
            y0, x0 = y.floor().long(), xx.floor().long()
            y1, x1 = (y0 + 1).clamp(max=s - 1), (x0 + 1).clamp(max=s - 1)
            dy, dx = y - y0, xx - x0
            table = self.pos_embed.weight
            emb = (table[y0 * s + x0] * ((1 - dy) * (1 - dx))[:, None] + table[y0 * s + x1] * ((1 - dy) * dx)[:, None]
                   + table[y1 * s + x0] * (dy * (1 - dx))[:, None] + table[y1 * s + x1] * (dy * dx)[:, None])
            embeds.append(emb.repeat(t, 1))
            rows_all.append(rows.repeat(t))
            cols_all.append(cols.repeat(t))
        rows, cols = torch.cat(rows_all), torch.cat(cols_all)
        angles = torch.cat([rows[:, None].float() * self.inv_freq, cols[:, None].float() * self.inv_freq], dim=-1)
        return (torch.cat(embeds), *cos_sin(angles, torch.float32))  # cos/sin [n, head_dim]


class ImagePatchesEncoder(PatchItemsEncoder):
    """The encoder stage's `BatchEncoder` (omni/layers/vision_items.py). Output, in the thinker's keys:
    {"image_embeds": [tokens, out_hidden], "image_deepstack": [deepstack layers, tokens, out_hidden],
    "image_grid_thw": [1, 3]}. A video's item adds {"kind": "video", "second_per_grid": float,
    "audio_tokens": int} and its output has the `video_` keys, with `video_second_per_grid` [1] and
    `video_audio_tokens` [1] (the thinker's M-RoPE needs both)."""

    def item_output(self, o: VisionOutput, grid: tuple[int, int, int], item: dict) -> dict:
        out = super().item_output(o.embeds, grid, item)
        out[f"{item_kind(item)}_deepstack"] = torch.stack(o.deepstack) if o.deepstack else \
            o.embeds.new_zeros(0, *o.embeds.shape)
        return out
