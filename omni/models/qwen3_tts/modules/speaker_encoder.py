"""Qwen3-TTS Base's speaker encoder: 24 kHz audio -> log-mel -> ECAPA-TDNN -> one x-vector
(the talker's speaker row). Module names follow the checkpoint (`speaker_encoder.` in
model.safetensors); the mel settings are the reference's (n_fft 1024, hop 256, 128 Slaney mels
up to 12 kHz, reflect padding, magnitude spectrum, natural log floored at 1e-5).

The ECAPA-TDNN itself is shared (omni/layers/ecapa.py): a clip's embedding depends on its exact
length, so clips are embedded one at a time, never padded together.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from omni.layers.ecapa import ECAPA
from omni.layers.mel import mel_filters
from omni.models.weights import load_into

PREFIX = "speaker_encoder"
SAMPLE_RATE = 24000
N_FFT, HOP, N_MELS, F_MAX = 1024, 256, 128, 12000.0


def log_mel(pcm: np.ndarray | torch.Tensor, device="cpu") -> torch.Tensor:
    """Mono 24 kHz float32 [n] -> [frames, 128] float32."""
    y = torch.as_tensor(np.asarray(pcm, dtype=np.float32), device=device)[None]
    pad = (N_FFT - HOP) // 2
    y = torch.nn.functional.pad(y[:, None], (pad, pad), mode="reflect")[:, 0]
    window = torch.hann_window(N_FFT, device=y.device)
    spec = torch.stft(y, N_FFT, hop_length=HOP, win_length=N_FFT, window=window, center=False,
                      normalized=False, onesided=True, return_complex=True)
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    basis = torch.from_numpy(mel_filters(N_MELS, N_FFT, SAMPLE_RATE, 0.0, F_MAX)).to(y.device).T
    mel = torch.matmul(basis, magnitude)
    return torch.log(torch.clamp(mel, min=1e-5))[0].T


class SpeakerEncoder(ECAPA):
    """cfg: a SpeakerEncoderConfig (omni.models.qwen3_tts.config)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.sample_rate = cfg.sample_rate

    @classmethod
    def from_checkpoint(cls, model_dir: str | Path, dtype=None, device: str = "cpu") -> "SpeakerEncoder":
        from omni.models.qwen3_tts.config import load_config

        cfg = load_config(model_dir).speaker_encoder
        if cfg is None:
            raise ValueError(f"{model_dir} is not a Base (voice cloning) checkpoint: it has no speaker encoder")
        with torch.device(device):
            model = cls(cfg)
        load_into(model, model_dir, PREFIX, dtype=dtype, device=device)
        return model.eval()

    @torch.inference_mode()
    def embed(self, pcm: np.ndarray) -> np.ndarray:
        """One clip, mono float32 at `sample_rate` (24 kHz) -> its x-vector, float32 [enc_dim]."""
        p = next(self.parameters())
        mels = log_mel(pcm, p.device)[None].to(p.dtype)
        return self(mels)[0].float().cpu().numpy()
