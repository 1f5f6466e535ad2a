"""Tiny synthetic videos made with PyAV for the video-input tests (no tests here)."""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np


def video_bytes(frames: int = 8, fps: int = 4, height: int = 48, width: int = 64, seed: int = 0,
                audio_seconds: float | None = None, audio_rate: int = 16000, container: str = "mp4") -> bytes:
    """An mp4 (MPEG-4 part 2 video, AAC audio when `audio_seconds` is given) of random-ish frames:
    smooth gradients plus noise, so resizing and the vision tower see varied pixels. `container`
    "matroska" writes the same streams into an mkv, which states no frame count."""
    import av

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        vs = out.add_stream("mpeg4", rate=fps)
        vs.width, vs.height, vs.pix_fmt = width, height, "yuv420p"
        vs.codec_context.time_base = Fraction(1, fps)
        aud = None
        if audio_seconds:
            aud = out.add_stream("aac", rate=audio_rate)
            aud.layout = "mono"
        yy, xx = np.mgrid[0:height, 0:width]
        for i in range(frames):
            base = np.stack([(xx * 4 + i * 20) % 256, (yy * 5 + i * 35) % 256, (xx + yy + i * 50) % 256], -1)
            img = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = i
            for packet in vs.encode(frame):
                out.mux(packet)
        for packet in vs.encode(None):
            out.mux(packet)
        if aud is not None:
            t = np.arange(int(audio_seconds * audio_rate)) / audio_rate
            pcm = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
            step = 1024
            for k in range(0, pcm.size, step):
                chunk = pcm[k:k + step]
                af = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="flt", layout="mono")
                af.sample_rate, af.pts = audio_rate, k
                for packet in aud.encode(af):
                    out.mux(packet)
            for packet in aud.encode(None):
                out.mux(packet)
    return buf.getvalue()
