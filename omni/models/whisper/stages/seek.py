"""Whisper's "seek" within a window, as transformers' `generate` does it with timestamps.

A timestamped decoding pass that stops inside an unfinished segment (it does not end on a single
timestamp, and it closed at least one segment with a pair of timestamps) keeps only its complete
segments; decoding starts again from the last closing timestamp, on the window's log-mel frames
from there on (zero-padded back to 3000 frames), until a pass ends cleanly or the window is used up.
"""

from __future__ import annotations

import torch

from omni.models.whisper.modules.features import WINDOW_FRAMES

FRAMES_PER_TIMESTAMP = 2  # one timestamp step (0.02 s) is two 10 ms log-mel frames


def cut(tokens: list[int], timestamp_begin: int) -> tuple[int, int | None]:
    """(how many leading tokens to keep, frames to seek forward, or None when the pass is final).

    `tokens` are one pass's output without end-of-text."""
    is_ts = [t >= timestamp_begin for t in tokens]
    pairs = [i + 1 for i in range(len(tokens) - 1) if is_ts[i] and is_ts[i + 1]]
    if not pairs or is_ts[-2:] == [False, True]:
        return len(tokens), None
    keep = pairs[-1] + 1
    frames = (tokens[keep - 2] - timestamp_begin) * FRAMES_PER_TIMESTAMP
    return keep, frames if frames > 0 else None


def shifted_mel(mel: torch.Tensor, seek: int) -> torch.Tensor:
    """[n_mels, 3000] frames from `seek` on, zero-padded at the end to 3000."""
    out = torch.zeros_like(mel)
    rest = mel[:, seek:WINDOW_FRAMES]
    out[:, : rest.shape[1]] = rest
    return out
