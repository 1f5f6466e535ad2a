"""Video files -> sampled RGB frames (and the audio track), with PyAV; shared by every family.

What is common to the omni families lives here: opening the container, reading its metadata the
way transformers' PyAV reader does (`stream.frames` and `stream.average_rate`; a container that
does not state its frame count is counted by decoding it), decoding only up to the last frame a
family's sampling rule picks, converting those frames to RGB24 arrays, and decoding the audio
track. Which frames to keep (`FrameRule.indices`) and how to resize and patchify them is the
family's (`omni.layers.video_patches`, with a family's pixel budget); each kept frame goes through the
family's `FrameRule.frame` as it is decoded, so a long video never holds its full-size frames.

`probe` reads only what bounds need (size, frame count, duration, an audio stream) and decodes
every frame once to prove the file decodes, so that an unreadable video is the API's 400.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from omni.kernel.errors import InvalidRequest


class VideoDecodeError(ValueError):
    """The bytes are not a video FFmpeg can read (or have no video stream)."""


class FrameRule(Protocol):
    """A family's frame sampling: the indices (ascending) of the frames it keeps, and what it makes
    of each kept RGB frame as soon as it is decoded (its resize: only the resized frames are held)."""

    def indices(self, total_frames: int, fps: float) -> list[int]: ...

    def frame(self, rgb: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class VideoInfo:
    width: int
    height: int
    frames: int  # decoded frames (or the container's count, when `probe` did not decode)
    fps: float  # the stream's average rate, as transformers' PyAV reader takes it
    seconds: float
    has_audio: bool


@dataclass
class VideoClip:
    frames: np.ndarray  # uint8 [n, H, W, 3] RGB, the sampled frames in order (after `FrameRule.frame`)
    indices: list[int]  # which frames of the file they are
    total_frames: int
    fps: float


def _open(raw: bytes):
    import av

    try:
        container = av.open(io.BytesIO(raw), mode="r")
    except Exception as exc:  # FFmpeg's errors, and what PyAV raises on bytes it cannot parse at all
        raise VideoDecodeError(f"{type(exc).__name__}: {exc}") from None
    if not container.streams.video:
        container.close()
        raise VideoDecodeError("the file holds no video stream")
    return container


def _metadata(container) -> tuple[int, float]:
    stream = container.streams.video[0]
    rate = stream.average_rate
    return int(stream.frames or 0), float(rate) if rate else 0.0


def probe(raw: bytes, max_frames: int, max_pixels: int) -> VideoInfo:
    """The video's size, frame count, rate and duration, every frame decoded once (no pixels kept).

    Stops with the count at `max_frames + 1` (a file that claims fewer frames than it holds costs no
    more than the bound) and at the first frame over `max_pixels`."""
    container = _open(raw)
    try:
        stream = container.streams.video[0]
        width, height = int(stream.codec_context.width or 0), int(stream.codec_context.height or 0)
        claimed, fps = _metadata(container)
        has_audio = bool(container.streams.audio)
        frames = 0
        if width * height > max_pixels:
            return VideoInfo(width, height, claimed, fps, claimed / fps if fps else 0.0, has_audio)
        for frame in container.decode(stream):
            width, height = frame.width, frame.height
            frames += 1
            if frames > max_frames or width * height > max_pixels:
                break
    except Exception as exc:
        raise VideoDecodeError(f"{type(exc).__name__}: {exc}") from None
    finally:
        container.close()
    if frames == 0:
        raise VideoDecodeError("the video stream has no frames")
    if frames <= max_frames and width * height <= max_pixels and claimed > frames:
        raise VideoDecodeError(f"the video states {claimed} frames but holds {frames}")  # frames are sampled by it
    if not fps:
        raise VideoDecodeError("the video stream has no frame rate")
    return VideoInfo(width, height, frames, fps, frames / fps, has_audio)


def decode(raw: bytes, rule: FrameRule, admit: Callable[[int, int, int], None] | None = None) -> VideoClip:
    """The frames `rule` picks, as RGB24 arrays made over by `rule.frame` (decoding stops after the
    last). `admit(frames, height, width)`, when given, may refuse the video (raise) once it is known
    how many frames of which size would be kept, before any is decoded."""
    container = _open(raw)
    try:
        total, fps = _metadata(container)
        if total <= 0:  # the container does not say: count by decoding (transformers would fail here)
            total = sum(1 for _ in container.decode(video=0))
            container.seek(0)
        if not fps:
            raise VideoDecodeError("the video stream has no frame rate")
        keep = rule.indices(total, fps)
        if admit is not None:
            stream = container.streams.video[0]
            admit(len(keep), int(stream.codec_context.height or 0), int(stream.codec_context.width or 0))
        wanted, frames = set(keep), {}
        last = keep[-1] if keep else -1
        for i, frame in enumerate(container.decode(video=0)):
            if i > last:
                break
            if i in wanted:
                frames[i] = rule.frame(frame.to_ndarray(format="rgb24"))
    except (VideoDecodeError, InvalidRequest):
        raise
    except Exception as exc:
        raise VideoDecodeError(f"{type(exc).__name__}: {exc}") from None
    finally:
        container.close()
    missing = [i for i in keep if i not in frames]
    if missing or not keep:
        raise VideoDecodeError(f"the video holds fewer frames than it states ({total}): frame {missing[:1]} "
                               "could not be decoded" if missing else "no frames were sampled")
    return VideoClip(np.stack([frames[i] for i in keep]), list(keep), total, fps)
