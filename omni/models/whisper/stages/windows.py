"""Long audio -> windows of at most 30 s, cut at the quietest moment near each window's end.

Whisper sees 30 s at a time. Cutting at fixed 30 s marks splits words; instead each cut goes
to the quietest 100 ms (lowest RMS) in the last `search_s` seconds of the window, so windows
are decoded independently (and in parallel) and their texts joined.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omni.models.whisper.modules.features import SAMPLE_RATE, WINDOW_SAMPLES


@dataclass
class Window:
    index: int
    start: int  # sample offsets in the clip
    end: int

    @property
    def offset_s(self) -> float:
        return self.start / SAMPLE_RATE

    @property
    def duration_s(self) -> float:
        return (self.end - self.start) / SAMPLE_RATE


def split_windows(pcm: np.ndarray, search_s: float = 8.0, frame_s: float = 0.1) -> list[Window]:
    n = len(pcm)
    frame = max(1, int(frame_s * SAMPLE_RATE))
    search = int(search_s * SAMPLE_RATE)
    windows, start = [], 0
    while n - start > WINDOW_SAMPLES:
        lo, hi = start + WINDOW_SAMPLES - search, start + WINDOW_SAMPLES
        span = pcm[lo:hi].astype(np.float64)
        frames = span[: len(span) // frame * frame].reshape(-1, frame)
        quietest = int(np.argmin((frames ** 2).mean(axis=1)))
        cut = lo + quietest * frame + frame // 2
        windows.append(Window(len(windows), start, cut))
        start = cut
    windows.append(Window(len(windows), start, n))
    return windows
