"""Audio through PyAV (FFmpeg, bundled in its wheels): what browsers and phones record, and AAC out.

libsndfile (media.py) reads wav, flac, ogg and mp3; MediaRecorder gives webm/opus, iOS gives
m4a/aac, and video files carry mp4 audio: those are decoded here. AAC is written as ADTS, a stream
of self-describing frames, so it streams as it is encoded (OpenAI's `aac` speech format).
"""

from __future__ import annotations

import io

import numpy as np

AAC_BITRATE = 96_000


class AvDecodeError(ValueError):
    """The bytes are not audio FFmpeg can read."""


def decode(raw: bytes, max_seconds: float) -> tuple[np.ndarray, int, bool]:
    """(mono float32 pcm, rate, cut): `cut` when the audio went on past `max_seconds` (decoding
    stops there, so a long file costs no more than the limit)."""
    import av

    try:
        with av.open(io.BytesIO(raw), mode="r") as container:
            streams = [s for s in container.streams if s.type == "audio"]
            if not streams:
                raise AvDecodeError("the file holds no audio stream")
            stream = streams[0]
            rate = int(stream.rate or stream.codec_context.sample_rate or 0)
            if rate <= 0:
                raise AvDecodeError("the audio stream has no sample rate")
            mixer = av.AudioResampler(format="flt", layout="mono", rate=rate)
            limit = int(max_seconds * rate)
            parts, total = [], 0
            for frame in container.decode(stream):
                for out in mixer.resample(frame):
                    parts.append(out.to_ndarray().reshape(-1))
                    total += parts[-1].size
                if total > limit:
                    return np.concatenate(parts)[:limit + 1], rate, True
            for out in mixer.resample(None):
                parts.append(out.to_ndarray().reshape(-1))
    except AvDecodeError:
        raise
    except (av.FFmpegError, ValueError, StopIteration, IndexError) as exc:
        raise AvDecodeError(f"{type(exc).__name__}: {exc}") from None
    pcm = np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)
    return pcm, rate, False


class AacStream:
    """float32 mono chunks in, ADTS AAC bytes out as soon as FFmpeg has encoded them."""

    def __init__(self, sample_rate: int, bitrate: int = AAC_BITRATE) -> None:
        import av

        self.rate = sample_rate
        self._buf = io.BytesIO()
        self._container = av.open(self._buf, mode="w", format="adts")
        self._stream = self._container.add_stream("aac", rate=sample_rate)
        self._stream.bit_rate = bitrate
        self._stream.layout = "mono"
        self._pts = 0

    def _take(self) -> bytes:
        out = self._buf.getvalue()
        self._buf.seek(0)
        self._buf.truncate()
        return out

    def feed(self, pcm: np.ndarray) -> bytes:
        import av

        pcm = np.clip(np.asarray(pcm, dtype=np.float32), -1.0, 1.0)
        if pcm.size:
            frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="flt", layout="mono")
            frame.sample_rate, frame.pts = self.rate, self._pts
            self._pts += pcm.size
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        return self._take()

    def finish(self) -> bytes:
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        return self._take()
