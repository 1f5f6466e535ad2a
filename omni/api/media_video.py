"""Client video in: `video_url` parts (data URLs or allow-listed hosts, as images), checked here.

A video is bounded before any stage sees it: its bytes (`max_video_bytes`, 413), one frame's
pixels (`max_video_pixels`, 413), the frames it holds (`max_video_frames`, 413: every frame is
decoded once here to prove the file decodes) and its length (`max_video_seconds`, 413). A file
FFmpeg cannot read, or one with no video stream, is a 400 `invalid_video`. It then travels on as
the original file bytes; the model's preprocess samples and resizes the frames as its family's
processor does (omni.layers.video_frames). With `use_audio_in_video` its audio track is decoded
here like any input audio (16 kHz mono, bounded by the request's `AudioBudget`) and rides with it;
a video without an audio track is then taken without one, as transformers' processor does.
What the request holds beyond its body (a fetched file, a decoded track) is held on the `uploads`
memory budget with the body (`hold`), until the request ends: past the budget, a 429.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from omni.api.errors import ApiError, bad_request, too_large
from omni.api.media import (MODEL_AUDIO_RATE, AudioBudget, MediaLimits, audio_part, decode_audio, fetch_media,
                            off_loop, parse_media_url)
from omni.layers.video_frames import VideoDecodeError, VideoInfo, probe


def check_video(raw: bytes, param: str, limits: MediaLimits) -> VideoInfo:
    """The video's metadata once every bound holds (413) and it decodes (400)."""
    if len(raw) > limits.max_video_bytes:
        raise too_large(f"{param}: video is {len(raw)} bytes; the limit is {limits.max_video_bytes}", param)
    if not raw:
        raise bad_request(f"{param}: video is empty", param=param, code="invalid_video")
    try:
        info = probe(raw, limits.max_video_frames, limits.max_video_pixels)
    except VideoDecodeError as exc:
        raise bad_request(f"{param}: could not decode video ({exc}); send a video file FFmpeg reads (mp4, webm, "
                          "mkv, mov...)", param=param, code="invalid_video") from None
    if info.width * info.height > limits.max_video_pixels:
        raise too_large(f"{param}: video frames are {info.width}x{info.height} pixels; the limit is "
                        f"{limits.max_video_pixels} pixels", param)
    if info.frames > limits.max_video_frames:
        raise too_large(f"{param}: video holds more than {limits.max_video_frames} frames (the limit)", param)
    if info.seconds > limits.max_video_seconds:
        raise too_large(f"{param}: video lasts {info.seconds:.1f} s; the limit is {limits.max_video_seconds:.0f} s",
                        param)
    return info


async def video_content(url: str, param: str, limits: MediaLimits, use_audio: bool, audio_budget: AudioBudget,
                        hold: Callable[[int], None] | None = None) -> dict:
    """One `video_url` part in the params contract: {"type": "video", "data": bytes[, "audio": ...]}
    (params.py adds the request's "fps"); `hold(nbytes)` takes more of the request's memory budget."""
    hold = hold or (lambda nbytes: None)
    raw, remote = await off_loop(parse_media_url, url, param, limits, "video")
    if raw is None:
        raw = await fetch_media(remote, param, limits, "video", limits.max_video_bytes, _checked)
        hold(len(raw))
    info = await off_loop(check_video, raw, param, limits)
    part = {"type": "video", "data": raw}
    if use_audio and info.has_audio:
        try:
            # the file's bytes are the video's, bounded above: only the audio's own bounds apply here
            track_limits = replace(limits, max_audio_bytes=limits.max_video_bytes)
            pcm, rate = await decode_audio(raw, param, track_limits, MODEL_AUDIO_RATE)
        except ApiError as exc:
            if exc.status != 400:
                raise
            raise bad_request(f"{param}: could not decode the video's audio track ({exc.message})", param=param,
                              code="invalid_video") from None
        audio_budget.take(len(pcm) / rate, param)
        hold(pcm.nbytes)
        part["audio"] = audio_part(pcm, rate)
    return part


def _checked(raw: bytes, param: str, limits: MediaLimits) -> bytes:
    check_video(raw, param, limits)
    return raw
