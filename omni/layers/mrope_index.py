"""The 3-D (M-RoPE) position index of a Qwen omni thinker or talker prompt (Qwen3-Omni, Qwen2.5-Omni);
the rotary tables of those positions are `omni.layers.rotary.mrope_cos_sin`.

Every token has a (temporal, height, width) position. Text and audio tokens use the same
number on all three axes, increasing by one per token. An image or video placeholder run
gets `start + (t * seconds_per_grid * position_id_per_seconds, h, w)` over its merged grid;
the next token continues at (largest position so far) + 1. Qwen2.5-Omni rounds a video's temporal
positions down to whole numbers (`RopeTokens.integer_time`); Qwen3-Omni keeps them fractional. Generated tokens sit at
`index + delta`, with `delta = next position after the prompt - prompt length`.

A video with its audio track (`use_audio_in_video`) is one run of video and audio tokens: the audio
token k sits at `start + k` on all axes, the video tokens as above from the same `start`, the two
merged in position order (video first on ties), as transformers' Qwen3-Omni `get_rope_index` does; the
next token then continues at (largest position of the run's last piece) + 1, as it does too.
Qwen2.5-Omni (`RopeTokens.audio_chunk`) orders the run in chunks instead (av_interleave.py: each chunk's
video, then its audio), and gives the run's two start tokens (vision, audio) one position and its two
end tokens one position, as its `get_rope_index` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omni.kernel.errors import InvalidRequest
from omni.layers.av_interleave import VIDEO, chunked_pieces


@dataclass(frozen=True)
class VisionGrid:
    """One image or video in the prompt: its patch grid and, for videos, seconds per grid step."""

    t: int
    h: int
    w: int
    seconds_per_grid: float = 1.0
    audio_tokens: int = 0  # a video's audio track interleaved with it (use_audio_in_video)


@dataclass(frozen=True)
class RopeTokens:
    image_token_id: int
    video_token_id: int
    position_id_per_seconds: float
    spatial_merge_size: int
    integer_time: bool = False  # temporal positions truncated to integers (Qwen2.5-Omni's `.long()`)
    audio_token_id: int = -1  # only needed for videos with their audio
    audio_chunk: int = 0  # > 0: a video and its audio interleave in chunks of this many positions (Qwen2.5-Omni)


def rope_index(
    token_ids: list[int],
    tokens: RopeTokens,
    images: list[VisionGrid] = (),
    videos: list[VisionGrid] = (),
) -> tuple[torch.Tensor, float]:
    """3-D positions [3, len(token_ids)] (float32) of a prompt and its decode `delta`.

    Image/video placeholder tokens must come in runs of exactly t*h*w / merge**2 tokens per
    grid, in order (a video with `audio_tokens` takes that many audio tokens more, interleaved);
    raises InvalidRequest otherwise.
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
        if kind == "video" and grid.audio_tokens:
            n += grid.audio_tokens
            run = token_ids[i : i + n]
            if len(run) != n or run.count(tok) != n - grid.audio_tokens or \
                    run.count(tokens.audio_token_id) != grid.audio_tokens:
                raise InvalidRequest(f"video grid {grid} with its audio needs {n} interleaved video and audio "
                                     f"tokens at {i}")
            if tokens.audio_chunk:
                if i < 2 or i + n + 2 > len(token_ids):
                    raise InvalidRequest(f"video grid {grid} with its audio needs two start and two end tokens")
                start = next_pos - 1  # the audio start token takes the vision start token's position
                out[:, i - 1] = start - 1
                out[:, i : i + n], end = _in_chunks(grid, gh, gw, tokens, start)
                out[:, i + n : i + n + 2] = end  # and the two end tokens share one
                next_pos, i = end + 1, i + n + 2
                continue
            out[:, i : i + n], next_pos = _with_audio(grid, gh, gw, tokens, next_pos)
            i += n
            continue
        if token_ids[i : i + n] != [tok] * n:
            raise InvalidRequest(f"{kind} grid {grid} needs {n} consecutive placeholder tokens at {i}")
        seconds = 1.0 if kind == "image" else grid.seconds_per_grid
        block = _vision_block(grid.t, gh, gw, seconds, tokens, next_pos)
        out[:, i : i + n] = block
        next_pos = block.max() + 1
        i += n
    for tok, left in queues.items():
        if left:
            raise InvalidRequest(f"{len(left)} vision grid(s) without placeholder tokens")
    return out, float(next_pos) - len(token_ids)


def _vision_block(t: int, gh: int, gw: int, seconds: float, tokens: RopeTokens, start: torch.Tensor) -> torch.Tensor:
    """(start + t * seconds * per_second, start + h, start + w) over a merged t x gh x gw grid."""
    t_idx = (torch.arange(t) * torch.tensor(seconds, dtype=torch.float32) * tokens.position_id_per_seconds).float()
    if tokens.integer_time:
        t_idx = t_idx.floor()
    t_idx = t_idx.view(-1, 1).expand(-1, gh * gw).flatten()
    h_idx = torch.arange(gh).view(1, -1, 1).expand(t, -1, gw).flatten().float()
    w_idx = torch.arange(gw).view(1, 1, -1).expand(t, gh, -1).flatten().float()
    return torch.stack([t_idx, h_idx, w_idx]) + start


def _with_audio(grid: VisionGrid, gh: int, gw: int, tokens: RopeTokens, start: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [3, video + audio tokens] of a video interleaved with its audio, and the next start."""
    video = _vision_block(grid.t, gh, gw, grid.seconds_per_grid, tokens, start)
    audio = torch.arange(grid.audio_tokens, dtype=torch.float32).expand(3, -1) + start
    pieces, v, a = [], 0, 0
    while v < video.shape[1] and a < audio.shape[1]:
        if video[0, v] <= audio[0, a]:
            pieces.append(video[:, v : v + 1])
            v += 1
        else:
            pieces.append(audio[:, a : a + 1])
            a += 1
    if v < video.shape[1]:
        pieces.append(video[:, v:])
    if a < audio.shape[1]:
        pieces.append(audio[:, a:])
    return torch.cat(pieces, dim=1), pieces[-1].max() + 1


def _in_chunks(grid: VisionGrid, gh: int, gw: int, tokens: RopeTokens, start: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [3, video + audio tokens] of a video and its audio in chunks (av_interleave.py), and the
    position after the run's last piece (its end tokens')."""
    video = _vision_block(grid.t, gh, gw, grid.seconds_per_grid, tokens, start)
    audio = torch.arange(grid.audio_tokens, dtype=torch.float32).expand(3, -1) + start
    pieces = [(video if kind == VIDEO else audio)[:, a:b]
              for kind, a, b in chunked_pieces((video[0] - start).tolist(), grid.audio_tokens, tokens.audio_chunk)]
    return torch.cat(pieces, dim=1), pieces[-1].max() + 1
