"""Slaney-style mel filterbanks (librosa's default: Slaney mel scale, area-normalised filters),
shared by the families whose features use them (Whisper's log-mels, Qwen3-TTS's speaker encoder)."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

_MEL_BREAK_HZ = 1000.0
_MEL_BREAK = 15.0  # 1000 Hz on the Slaney scale (3 / 200 mel per Hz below the break)
_LOG_STEP = math.log(6.4) / 27.0


def hz_to_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz * 3.0 / 200.0
    log = _MEL_BREAK + np.log(np.maximum(hz, 1e-12) / _MEL_BREAK_HZ) / _LOG_STEP
    return np.where(hz >= _MEL_BREAK_HZ, log, linear)


def mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    linear = mel * 200.0 / 3.0
    log = _MEL_BREAK_HZ * np.exp(_LOG_STEP * (mel - _MEL_BREAK))
    return np.where(mel >= _MEL_BREAK, log, linear)


@lru_cache(maxsize=8)
def mel_filters(n_mels: int, n_fft: int, sample_rate: int, f_min: float = 0.0, f_max: float | None = None
                ) -> np.ndarray:
    """[n_fft // 2 + 1, n_mels] triangular filters between f_min and f_max (default: Nyquist),
    each scaled to unit area (Slaney norm)."""
    f_max = sample_rate / 2 if f_max is None else f_max
    fft_hz = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2))
    lo, mid, hi = edges[:-2], edges[1:-1], edges[2:]
    rising = (fft_hz[:, None] - lo) / (mid - lo)
    falling = (hi - fft_hz[:, None]) / (hi - mid)
    bank = np.maximum(0.0, np.minimum(rising, falling))
    return (bank * (2.0 / (hi - lo))).astype(np.float32)
