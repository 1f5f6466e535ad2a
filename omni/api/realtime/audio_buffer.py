"""The input audio buffer: 24 kHz pcm16 from the client, kept as 16 kHz float32 (what the voice
detector and the audio encoders take), addressed by absolute sample index since the session began. What it holds is on a lease of the
server's `realtime_audio` budget: every session's buffer together stays under it.
"""

from __future__ import annotations

import numpy as np

from omni.api.budgets import Lease
from omni.api.errors import bad_request
from omni.api.media import resample
from omni.api.realtime.vad import VAD_RATE

IN_RATE = 24000


class InputAudio:
    def __init__(self, max_samples: int, lease: Lease) -> None:
        import soxr

        self._resampler = soxr.ResampleStream(IN_RATE, VAD_RATE, 1, dtype="float32")
        self._chunks: list[np.ndarray] = []
        self.start = 0  # absolute index of the buffer's first sample
        self.end = 0  # absolute index one past its last
        self.max_samples = max_samples
        self.lease = lease

    def __len__(self) -> int:
        return self.end - self.start

    def append(self, pcm24: np.ndarray) -> np.ndarray:
        """Resample and keep; returns the new 16 kHz samples. A buffer past its own bound is a 400,
        past the total budget of every session's buffers a 429 (neither keeps the samples)."""
        expected = -(-len(pcm24) * VAD_RATE // IN_RATE)  # checked before the resampler takes it in
        if len(self) + expected > self.max_samples:
            raise bad_request(f"the input audio buffer would hold more than {self.max_samples // VAD_RATE} s; "
                              "commit or clear it", code="input_audio_buffer_full")
        self.lease.resize((len(self) + expected) * 4)
        pcm = self._resampler.resample_chunk(np.asarray(pcm24, np.float32))
        self.lease.settle((len(self) + len(pcm)) * 4)  # the resampler's delay: a few samples either way
        if len(pcm):
            self._chunks.append(pcm)
            self.end += len(pcm)
        return pcm

    def peek(self) -> np.ndarray:
        """Every sample the buffer holds, left in it."""
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0].copy() if self._chunks else np.zeros(0, np.float32)

    def take(self, until: int) -> np.ndarray:
        """The samples from the buffer's start up to absolute index `until`; they leave the buffer."""
        whole = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.float32)
        cut = max(0, min(until, self.end) - self.start)
        head, rest = whole[:cut], whole[cut:]
        self._chunks = [rest] if len(rest) else []
        self.start += cut
        self.lease.settle(len(self) * 4)
        return head

    def clear(self) -> None:
        self.take(self.end)

    def close(self) -> None:
        self._chunks = []
        self.start = self.end
        self.lease.close()

    @staticmethod
    def resample_whole(pcm24: np.ndarray) -> np.ndarray:
        return resample(pcm24, IN_RATE, VAD_RATE)
