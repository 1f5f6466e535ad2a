"""The 3-D (M-RoPE) position index of a Qwen omni thinker or talker prompt (Qwen3-Omni, Qwen2.5-Omni);
the rotary tables of those positions are `omni.layers.rotary.mrope_cos_sin`.

Every token has a (temporal, height, width) position. Text and audio tokens use the same
number on all three axes, increasing by one per token. An image or video placeholder run
gets `start + (t * seconds_per_grid * position_id_per_seconds, h, w)` over its merged grid;
the next token continues at (largest position so far) + 1. Qwen2.5-Omni rounds a video's temporal
positions down to whole numbers (`RopeTokens.integer_time`); Qwen3-Omni keeps them fractional. Generated tokens sit at
`index + delta`, with `delta = next position after the prompt - prompt length`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omni.kernel.errors import InvalidRequest


@dataclass(frozen=True)
class VisionGrid:
    """One image or video in the prompt: its patch grid and, for videos, seconds per grid step."""

    t: int
    h: int
    w: int
    seconds_per_grid: float = 1.0


@dataclass(frozen=True)
class RopeTokens:
    image_token_id: int
    video_token_id: int
    position_id_per_seconds: float
    spatial_merge_size: int
    integer_time: bool = False  # temporal positions truncated to integers (Qwen2.5-Omni's `.long()`)


def rope_index(
    token_ids: list[int],
    tokens: RopeTokens,
    images: list[VisionGrid] = (),
    videos: list[VisionGrid] = (),
) -> tuple[torch.Tensor, float]:
    """3-D positions [3, len(token_ids)] (float32) of a prompt and its decode `delta`.

    Image/video placeholder tokens must come in runs of exactly t*h*w / merge**2 tokens per
    grid, in order; raises InvalidRequest otherwise. (Audio-in-video interleaving is not
    supported.)
    """
    merge = tokens.spatial_merge_size
    out = torch.empty(3, len(token_ids), dtype=torch.float32)
    queues = {tokens.image_token_id: list(images), tokens.video_token_id: list(videos)}
    next_pos = torch.tensor(0.0)
    i = 0
    while i < len(token_ids):
        tok = token_ids[i]
        if tok not in queues:
            out[:, i] = next_pos
            next_pos = next_pos + 1
            i += 1
            continue
        kind = "image" if tok == tokens.image_token_id else "video"
        if not queues[tok]:
            raise InvalidRequest(f"more {kind} placeholder runs than {kind} grids given")
        grid = queues[tok].pop(0)
        gh, gw = grid.h // merge, grid.w // merge
        n = grid.t * gh * gw
        if token_ids[i : i + n] != [tok] * n:
            raise InvalidRequest(f"{kind} grid {grid} needs {n} consecutive placeholder tokens at {i}")
        seconds = 1.0 if kind == "image" else grid.seconds_per_grid
        t_idx = (torch.arange(grid.t) * torch.tensor(seconds, dtype=torch.float32) * tokens.position_id_per_seconds).float()
        if tokens.integer_time:
            t_idx = t_idx.floor()
        t_idx = t_idx.view(-1, 1).expand(-1, gh * gw).flatten()
        h_idx = torch.arange(gh).view(1, -1, 1).expand(grid.t, -1, gw).flatten().float()
        w_idx = torch.arange(gw).view(1, 1, -1).expand(grid.t, gh, -1).flatten().float()
        block = torch.stack([t_idx, h_idx, w_idx]) + next_pos
        out[:, i : i + n] = block
        next_pos = block.max() + 1
        i += n
    for tok, left in queues.items():
        if left:
            raise InvalidRequest(f"{len(left)} vision grid(s) without placeholder tokens")
    return out, float(next_pos) - len(token_ids)
