"""Whisper's log-mel features: 30 s windows of 16 kHz audio -> [n_mels, 3000] (100 frames a second).

Periodic Hann window of 400 samples, hop 160, centred frames with reflect padding, power
spectrum, Slaney-style mel filters (0-8 kHz, area-normalised), log10 floored at 1e-10, then
clipped to 8 (in log10 units) below the window's maximum and scaled as (x + 4) / 4.
"""

from __future__ import annotations

import numpy as np
import torch

from omni.layers.mel import mel_filters as shared_mel_filters

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
WINDOW_SECONDS = 30
WINDOW_SAMPLES = SAMPLE_RATE * WINDOW_SECONDS  # 480000
WINDOW_FRAMES = WINDOW_SAMPLES // HOP  # 3000

def mel_filters(n_mels: int, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """[n_fft // 2 + 1, n_mels] Slaney filters over 0-8 kHz."""
    return shared_mel_filters(n_mels, n_fft, sample_rate, 0.0, 8000.0)


def pad_window(pcm: np.ndarray) -> np.ndarray:
    """Zero-pad (or cut) mono 16 kHz audio to exactly one 30 s window."""
    out = np.zeros(WINDOW_SAMPLES, dtype=np.float32)
    n = min(len(pcm), WINDOW_SAMPLES)
    out[:n] = pcm[:n]
    return out


def log_mel(windows: np.ndarray | torch.Tensor, n_mels: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """[B, 480000] (or [480000]) float32 audio windows -> [B, n_mels, 3000] features."""
    audio = torch.as_tensor(windows, dtype=torch.float32, device=device)
    squeeze = audio.dim() == 1
    if squeeze:
        audio = audio[None]
    window = torch.hann_window(N_FFT, device=audio.device)
    spec = torch.stft(audio, N_FFT, HOP, window=window, center=True, pad_mode="reflect", return_complex=True)
    power = (spec[..., :-1].abs() ** 2).contiguous()  # [B, 201, 3000]
    filters = torch.from_numpy(mel_filters(n_mels)).to(audio.device)
    mel = torch.matmul(filters.T, power)
    logs = torch.clamp(mel, min=1e-10).log10()
    peak = logs.amax(dim=(1, 2), keepdim=True)
    logs = (torch.maximum(logs, peak - 8.0) + 4.0) / 4.0
    return logs[0] if squeeze else logs
