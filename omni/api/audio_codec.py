"""Audio out: float32 PCM to wav / pcm16 / flac / mp3 / opus / aac, whole or streamed as it is made.

wav, flac, mp3 and opus go through libsndfile (soundfile), which encodes MP3 (LAME) and Ogg Opus
itself; AAC (ADTS) goes through PyAV's FFmpeg (`av_audio`). Streaming writes through a forward-only sink: bytes leave as soon as
libsndfile writes them, and header fix-ups it makes at close are dropped. Streamed MP3 is
constant-bitrate with LAME's blank tag frame removed, so a decoder's length estimate from the first
frame is right. WAV is sent whole by default, its header carrying the true sizes (a streamed
header's 0xFFFFFFFF "unknown size", which OpenAI's server sends, makes Python's `wave` read a
0.24 s clip as 89,478 s); `StreamEncoder(..., stream_wav=True)` streams it with that header, for
clients that ask (`"stream": true` on /v1/audio/speech). FLAC is always sent whole at the end: a
FLAC stream without its total length is valid, but libsndfile (hence soundfile) cannot read one.
"""

from __future__ import annotations

import io
import struct

import numpy as np

from omni.api.media import resample

CONTENT_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "pcm16": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg; codecs=opus",
    "aac": "audio/aac",
}
_SNDFILE = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}
_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
PCM16_RATE = 24000  # OpenAI's pcm16 / pcm output is 24 kHz mono little-endian


def to_pcm16(pcm: np.ndarray) -> bytes:
    clipped = np.clip(np.asarray(pcm, dtype=np.float32), -1.0, 1.0)
    return (clipped * 32767.0).round().astype("<i2").tobytes()


def wav_header(sample_rate: int, data_bytes: int | None) -> bytes:
    """A 16-bit mono RIFF header; `data_bytes=None` writes the streaming 'unknown size' marker."""
    size = 0xFFFFFFFF if data_bytes is None else data_bytes
    riff = 0xFFFFFFFF if data_bytes is None else 36 + data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16) +
            b"data" + struct.pack("<I", size))


def output_rate(fmt: str, sample_rate: int) -> int:
    """The rate a format is written at: pcm is always 24 kHz; opus only takes a few rates."""
    if fmt in ("pcm", "pcm16"):
        return PCM16_RATE
    if fmt == "opus" and sample_rate not in _OPUS_RATES:
        return 48000
    return sample_rate


def encode_audio(pcm: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """Encode a whole clip."""
    rate = output_rate(fmt, sample_rate)
    pcm = resample(np.asarray(pcm, dtype=np.float32), sample_rate, rate)
    if fmt in ("pcm", "pcm16"):
        return to_pcm16(pcm)
    if fmt == "wav":
        data = to_pcm16(pcm)
        return wav_header(rate, len(data)) + data
    if fmt == "aac":
        from omni.api.av_audio import AacStream

        aac = AacStream(rate)
        return aac.feed(pcm) + aac.finish()
    import soundfile as sf

    major, subtype = _SNDFILE[fmt]
    buf = io.BytesIO()
    sf.write(buf, np.clip(pcm, -1.0, 1.0), rate, format=major, subtype=subtype)
    return buf.getvalue()


class _ForwardSink(io.RawIOBase):
    """A seekable file for libsndfile whose bytes can be taken away as they are written."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self._sent = 0  # bytes already handed out
        self._pos = 0
        self._end = 0

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        return b""

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._end}[whence]
        self._pos = base + offset
        return self._pos

    def write(self, data) -> int:
        data = bytes(data)
        start, end = self._pos, self._pos + len(data)
        lo = max(start, self._sent)  # rewrites of bytes already sent are dropped
        if end > lo:
            rel = lo - self._sent
            if rel > len(self._pending):
                self._pending.extend(b"\0" * (rel - len(self._pending)))
            self._pending[rel:rel + end - lo] = data[lo - start:]
        self._pos = end
        self._end = max(self._end, end)
        return len(data)

    def take(self) -> bytes:
        out = bytes(self._pending)
        self._sent += len(out)
        self._pending.clear()
        return out


class StreamEncoder:
    """Encode audio chunk by chunk: `feed(pcm)` and `finish()` return the bytes ready to send."""

    def __init__(self, fmt: str, sample_rate: int, stream_wav: bool = False) -> None:
        self.fmt = fmt
        self.in_rate = sample_rate
        self.rate = output_rate(fmt, sample_rate)
        self._resampler = None
        if self.rate != sample_rate:
            import soxr

            self._resampler = soxr.ResampleStream(sample_rate, self.rate, 1, dtype="float32")
        self._header_sent = False
        self._file = None
        self._sink: _ForwardSink | None = None
        if fmt in _SNDFILE:
            import soundfile as sf

            major, subtype = _SNDFILE[fmt]
            self._sink = _ForwardSink()
            extra = {"bitrate_mode": "CONSTANT", "compression_level": 0.5} if fmt == "mp3" else {}
            self._file = sf.SoundFile(self._sink, "w", samplerate=self.rate, channels=1, format=major,
                                      subtype=subtype, **extra)
        self._aac = None
        if fmt == "aac":
            from omni.api.av_audio import AacStream

            self._aac = AacStream(self.rate)
        self.buffered = fmt == "flac" or (fmt == "wav" and not stream_wav)  # see the module docstring
        self._wav_data = bytearray()  # a whole WAV's samples, until finish() knows their size
        self._mp3_head: bytearray | None = bytearray() if fmt == "mp3" else None

    def _resampled(self, pcm: np.ndarray, last: bool) -> np.ndarray:
        pcm = np.asarray(pcm, dtype=np.float32)
        if self._resampler is None:
            return pcm
        return self._resampler.resample_chunk(pcm, last=last)

    def _emit(self, pcm: np.ndarray) -> bytes:
        if self._aac is not None:
            return self._aac.feed(pcm)
        if self._file is not None:
            if len(pcm):
                self._file.write(np.clip(pcm, -1.0, 1.0))
            return b"" if self.buffered else self._strip_mp3_tag(self._sink.take())
        out = to_pcm16(pcm)
        if self.fmt == "wav" and self.buffered:
            self._wav_data += out
            return b""
        if self.fmt == "wav" and not self._header_sent:
            self._header_sent = True
            out = wav_header(self.rate, None) + out
        return out

    def feed(self, pcm: np.ndarray) -> bytes:
        return self._emit(self._resampled(pcm, last=False))

    def finish(self) -> bytes:
        out = self._emit(self._resampled(np.zeros(0, np.float32), last=True))
        if self.fmt == "wav" and self.buffered:
            out, self._wav_data = wav_header(self.rate, len(self._wav_data)) + bytes(self._wav_data), bytearray()
        if self._aac is not None:
            out += self._aac.finish()
            self._aac = None
        if self._file is not None:
            self._file.close()
            self._file = None
            out += self._strip_mp3_tag(self._sink.take(), last=True)
        return out

    def _strip_mp3_tag(self, data: bytes, last: bool = False) -> bytes:
        """Hold the first MP3 bytes until LAME's blank tag frame (a header, then zeros) can be cut off."""
        if self._mp3_head is None:
            return data
        self._mp3_head += data
        head = self._mp3_head
        nxt = head.find(b"\xff", 4)
        if nxt < 0 and not last:
            return b""
        self._mp3_head = None
        if nxt > 0 and head[:1] == b"\xff" and not any(head[4:nxt]):
            return bytes(head[nxt:])
        return bytes(head)
