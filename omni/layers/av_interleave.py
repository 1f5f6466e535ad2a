"""How a video's tokens and its audio track's tokens share one run of the prompt (use_audio_in_video),
in chunks of `per_chunk` temporal positions: each chunk's video tokens, then the same chunk's audio
tokens, as transformers' Qwen2.5-Omni writes them (its processor's `replace_video_with_audio_token`, its
model's `get_rope_index`). The preprocessor writes the token layout from `chunked_pieces`, the M-RoPE
index (mrope_index.py) places the positions in the same pieces. (Qwen3-Omni interleaves token by token
in time order instead: that rule is in preprocess.py and mrope_index.py.)
"""

from __future__ import annotations

from collections.abc import Sequence

VIDEO, AUDIO = 0, 1


def chunk_spans(values: Sequence[float], per_chunk: int) -> list[tuple[int, int]]:
    """[start, end) runs of ascending `values`: a new run each time a value reaches the next multiple of
    `per_chunk`, one boundary per value (a jump over several boundaries opens one run, as the reference's
    `get_chunked_index` counts; its positions and its layout can then tell chunks apart)."""
    if per_chunk < 1:
        raise ValueError(f"positions per chunk must be at least 1, got {per_chunk}")
    spans, start, chunk = [], 0, 1
    for i, value in enumerate(values):
        if value >= chunk * per_chunk:
            spans.append((start, i))
            start, chunk = i, chunk + 1
    spans.append((start, len(values)))
    return spans


def chunked_pieces(video_times: Sequence[float], audio_tokens: int, per_chunk: int) -> list[tuple[int, int, int]]:
    """(VIDEO or AUDIO, start, end) slices of the video's tokens (temporal positions `video_times`, from
    0) and of its audio's (positions 0, 1, ...), in prompt order: chunk j's video, then chunk j's audio."""
    video, audio = chunk_spans(video_times, per_chunk), chunk_spans(range(audio_tokens), per_chunk)
    pieces = []
    for j in range(max(len(video), len(audio))):
        if j < len(video):
            pieces.append((VIDEO, *video[j]))
        if j < len(audio):
            pieces.append((AUDIO, *audio[j]))
    return [p for p in pieces if p[2] > p[1]]
