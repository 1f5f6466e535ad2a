"""Client media in: base64 audio and images, checked and normalised before any stage sees them.

Audio is decoded with libsndfile (wav, flac, ogg, mp3) or, for what it cannot read (webm/opus,
m4a/aac, mp4 audio), with PyAV (`av_audio`); then mixed to mono float32 and resampled with
soxr to the rate the model takes. Images arrive as data URLs (or from operator allow-listed hosts),
are opened with Pillow to prove they are images, and travel on as the original file bytes.
Videos take the same path (data URLs, or the same allow-listed hosts), checked by `media_video`.
Server-side paths are never read.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import logging
import re
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

from omni.api.errors import ApiError, bad_request, too_large

log = logging.getLogger("omni.api")
MODEL_AUDIO_RATE = 16000  # what the audio encoders take


@dataclass
class MediaLimits:
    max_audio_bytes: int = 25 << 20
    max_audio_seconds: float = 600.0
    max_decoded_audio_bytes: int = 256 << 20  # channels x rate x duration x 4 (float32), before mixing down
    max_sample_abs: float = 4.0  # full scale is 1.0; float files may peak a little above it
    max_image_bytes: int = 20 << 20
    max_image_pixels: int = 40_000_000
    image_hosts: list[str] = field(default_factory=list)  # remote hosts allowed for image_url and video_url
    fetch_timeout_s: float = 10.0
    max_video_bytes: int = 64 << 20
    max_video_seconds: float = 600.0
    max_video_frames: int = 18_000  # frames the file holds (10 min at 30 fps): every one is decoded
    max_video_pixels: int = 3840 * 2160  # one frame's width x height


def b64decode_strict(data: str, param: str) -> bytes:
    """Decode base64 (a data URL prefix is tolerated); malformed input is a 400."""
    if data.startswith("data:"):
        data = data.partition(",")[2]
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_request(f"{param} is not valid base64: {exc}", param=param, code="invalid_base64") from None


def decode_audio_bytes(raw: bytes, param: str, limits: MediaLimits, target_rate: int = MODEL_AUDIO_RATE
                       ) -> tuple[np.ndarray, int]:
    """Decode an audio file's bytes to mono float32 at `target_rate`.

    The decoded size is bounded before decoding, from the header (channels x rate x duration), and
    the read itself never takes more frames than the bounds allow (a header may under-state them).
    """
    import soundfile as sf

    if len(raw) > limits.max_audio_bytes:
        raise too_large(f"{param}: audio is {len(raw)} bytes; the limit is {limits.max_audio_bytes}", param)
    if not raw:
        raise bad_request(f"{param}: audio is empty", param=param, code="invalid_audio")
    try:
        with sf.SoundFile(io.BytesIO(raw)) as f:
            max_frames = _frame_bound(f.frames, f.samplerate, f.channels, param, limits)
            pcm = f.read(max_frames + 1, dtype="float32", always_2d=True)
            rate = f.samplerate
    except ApiError:
        raise
    except Exception:  # libsndfile's errors are plain RuntimeErrors: not a format it reads; FFmpeg's turn
        pcm, rate = _decode_with_av(raw, param, limits)  # bounded by duration, mixed to mono as it goes
        max_frames = _frame_bound(pcm.shape[0], rate, pcm.shape[1], param, limits)
    if pcm.shape[0] == 0:
        raise bad_request(f"{param}: audio has no samples", param=param, code="invalid_audio")
    if pcm.shape[0] > max_frames:
        _frame_bound(pcm.shape[0], rate, pcm.shape[1], param, limits)  # raises the 413 that says which bound
    check_samples(pcm, param, limits)
    mono = pcm.mean(axis=1, dtype=np.float32) if pcm.shape[1] > 1 else pcm[:, 0]
    return resample(mono, rate, target_rate), target_rate


def _decode_with_av(raw: bytes, param: str, limits: MediaLimits) -> tuple[np.ndarray, int]:
    """webm/opus, m4a/aac, mp4 audio... through PyAV, as [samples, 1] float32 like soundfile's."""
    from omni.api.av_audio import AvDecodeError, decode

    try:
        pcm, rate, cut = decode(raw, limits.max_audio_seconds)
    except AvDecodeError as exc:
        raise bad_request(f"{param}: could not decode audio ({exc}); send wav, flac, ogg, mp3, webm, m4a or mp4 "
                          "audio", param=param, code="invalid_audio") from None
    if cut:
        raise too_large(f"{param}: audio lasts more than the limit of {limits.max_audio_seconds:.0f} s", param)
    return pcm[:, None], rate


def _frame_bound(frames: int, rate: int, channels: int, param: str, limits: MediaLimits) -> int:
    """The most frames the limits allow for this rate and channel count; a 413 when `frames` is over."""
    seconds = frames / max(rate, 1)
    if seconds > limits.max_audio_seconds:
        raise too_large(f"{param}: audio lasts {seconds:.1f} s; the limit is {limits.max_audio_seconds:.0f} s", param)
    decoded = frames * channels * 4
    if decoded > limits.max_decoded_audio_bytes:
        raise too_large(f"{param}: audio decodes to {decoded} bytes ({channels} channel(s) x {rate} Hz x "
                        f"{seconds:.1f} s, float32); the limit is {limits.max_decoded_audio_bytes} bytes", param)
    return min(int(limits.max_audio_seconds * rate), limits.max_decoded_audio_bytes // (4 * max(channels, 1)))


def check_samples(pcm: np.ndarray, param: str, limits: MediaLimits) -> None:
    """Samples must be finite and within +-max_sample_abs: huge ones overflow the features to inf/NaN."""
    if not np.isfinite(pcm).all():
        raise bad_request(f"{param}: audio holds NaN or infinite samples", param=param, code="invalid_audio")
    peak = float(np.abs(pcm).max()) if pcm.size else 0.0
    if peak > limits.max_sample_abs:
        raise bad_request(f"{param}: audio samples must lie within [-{limits.max_sample_abs:g}, "
                          f"{limits.max_sample_abs:g}] (full scale is 1.0); the peak is {peak:.3g}", param=param,
                          code="invalid_audio")


class AudioBudget:
    """All of one request's input audio shares max_audio_seconds: many small clips are one long one."""

    def __init__(self, limits: MediaLimits) -> None:
        self.limit, self.seconds = limits.max_audio_seconds, 0.0

    def take(self, seconds: float, param: str) -> None:
        self.seconds += seconds
        if self.seconds > self.limit:
            raise too_large(f"{param}: the request's audio lasts {self.seconds:.1f} s in all; the limit is "
                            f"{self.limit:.0f} s", param)


_DECODE_POOL = ThreadPoolExecutor(2, thread_name_prefix="omni-media")


async def off_loop(fn, *args):
    """Run media work (decoding, resampling) in the media pool, two at a time, never on the event loop."""
    return await asyncio.get_running_loop().run_in_executor(_DECODE_POOL, fn, *args)


async def decode_audio(raw: bytes, param: str, limits: MediaLimits, target_rate: int = MODEL_AUDIO_RATE
                       ) -> tuple[np.ndarray, int]:
    """`decode_audio_bytes` off the event loop, so decoding never stalls other clients."""
    return await off_loop(decode_audio_bytes, raw, param, limits, target_rate)


def resample(pcm: np.ndarray, rate: int, target_rate: int) -> np.ndarray:
    if rate == target_rate:
        return np.ascontiguousarray(pcm, dtype=np.float32)
    import soxr

    return soxr.resample(pcm.astype(np.float32), rate, target_rate).astype(np.float32)


def audio_part(pcm: np.ndarray, rate: int) -> dict:
    """The params shape the stages take for one piece of input audio."""
    return {"pcm": np.ascontiguousarray(pcm, dtype="<f4").tobytes(), "sample_rate": rate}


def _check_image(raw: bytes, param: str, limits: MediaLimits) -> bytes:
    from PIL import Image

    if len(raw) > limits.max_image_bytes:
        raise too_large(f"{param}: image is {len(raw)} bytes; the limit is {limits.max_image_bytes}", param)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw)) as img:
                width, height = img.size
                if width * height > limits.max_image_pixels:
                    raise too_large(f"{param}: image is {width}x{height} pixels; the limit is "
                                    f"{limits.max_image_pixels} pixels", param)
                img.verify()
    except ApiError:
        raise
    except Exception as exc:
        reason = re.sub(r"<[^<>]* at 0x[0-9a-f]+>", "the image", str(exc))  # no object reprs in messages
        raise bad_request(f"{param}: not a readable image ({type(exc).__name__}: {reason})", param=param,
                          code="invalid_image") from None
    return raw


def parse_image_url(url: str, param: str, limits: MediaLimits) -> tuple[bytes | None, str | None]:
    """Returns (image bytes, None) for a data URL or (None, url) for an allow-listed remote URL."""
    raw, remote = parse_media_url(url, param, limits, "image")
    return (None, remote) if raw is None else (_check_image(raw, param, limits), None)


def parse_media_url(url: str, param: str, limits: MediaLimits, kind: str) -> tuple[bytes | None, str | None]:
    """(the bytes of a `data:<kind>/...;base64,` URL, None) or (None, url) for an allow-listed remote
    URL; anything else (file paths and URLs, other schemes, other hosts) is a 400."""
    if url.startswith("data:"):
        header, sep, payload = url.partition(",")
        if not sep or not header.endswith(";base64"):
            raise bad_request(f"{param}: data URLs must be 'data:{kind}/<type>;base64,<data>'", param=param,
                              code=f"invalid_{kind}")
        if not header[5:].startswith(f"{kind}/"):
            raise bad_request(f"{param}: data URL media type must be {kind}/*, got {header[5:-7]!r}", param=param,
                              code=f"invalid_{kind}")
        return b64decode_strict(payload, param), None
    parts = urlsplit(url)
    if parts.scheme in ("http", "https") and parts.hostname:
        if parts.hostname.lower() in {h.lower() for h in limits.image_hosts}:
            return None, url
        raise bad_request(f"{param}: remote {kind} URLs are not allowed (host {parts.hostname!r} is not in the "
                          "server's allow-list); send a data URL", param=param, code=f"{kind}_url_not_allowed")
    raise bad_request(f"{param}: only data URLs (and allow-listed http(s) hosts) are accepted; file paths and "
                      f"{parts.scheme or 'scheme-less'} URLs never are", param=param, code=f"{kind}_url_not_allowed")


async def fetch_image(url: str, param: str, limits: MediaLimits) -> bytes:
    """Fetch an allow-listed remote image, bounded in size and time (`fetch_media`)."""
    return await fetch_media(url, param, limits, "image", limits.max_image_bytes, _check_image)


async def fetch_media(url: str, param: str, limits: MediaLimits, kind: str, max_bytes: int, check) -> bytes:
    """Fetch an allow-listed remote image or video, bounded in size and time; `check(raw, param,
    limits)` proves it is one.

    Every failure gives the same answer (the cause is logged): an error that differed by status,
    refusal, timeout or content would let a client map the ports and paths of an allowed host.
    """
    import aiohttp

    try:
        timeout = aiohttp.ClientTimeout(total=limits.fetch_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(url, allow_redirects=False) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                raw = await resp.content.read(max_bytes + 1)
        return await off_loop(check, raw, param, limits)
    except Exception as exc:  # not an image, or too large, reads the same too: it was fetched
        log.info("fetching %s for %s failed: %s: %s", url, param, type(exc).__name__, exc)
        raise bad_request(f"{param}: could not fetch {'an' if kind[0] in 'aeiou' else 'a'} {kind} from that URL",
                          param=param, code=f"{kind}_fetch_failed") from None
