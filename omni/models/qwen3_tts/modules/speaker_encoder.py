"""Qwen3-TTS Base's speaker encoder: 24 kHz audio -> log-mel -> ECAPA-TDNN -> one x-vector
(the talker's speaker row). Module names follow the checkpoint (`speaker_encoder.` in
model.safetensors); the mel settings are the reference's (n_fft 1024, hop 256, 128 Slaney mels
up to 12 kHz, reflect padding, magnitude spectrum, natural log floored at 1e-5).

Every conv pads "same" by reflection and the pooling is global over the clip, so a clip's
embedding depends on its exact length: clips are embedded one at a time, never padded together.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

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


def _conv(cin: int, cout: int, kernel: int, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNN(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, dilation: int):
        super().__init__()
        self.conv = _conv(cin, cout, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class Res2Net(nn.Module):
    """Channels in `scale` groups; group i > 0 is convolved after adding group i-1's output."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList([TDNN(channels // scale, channels // scale, kernel, dilation)
                                     for _ in range(scale - 1)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs: list[torch.Tensor] = []
        for i, part in enumerate(torch.chunk(x, self.scale, dim=1)):
            if i == 0:
                out = part
            elif i == 1:
                out = self.blocks[0](part)
            else:
                out = self.blocks[i - 1](part + out)
            outs.append(out)
        return torch.cat(outs, dim=1)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, se_channels: int):
        super().__init__()
        self.conv1 = _conv(channels, se_channels, 1)
        self.conv2 = _conv(se_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))
        return x * torch.sigmoid(self.conv2(s))


class SERes2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se_channels: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = TDNN(cin, cout, 1, 1)
        self.res2net_block = Res2Net(cout, scale, kernel, dilation)
        self.tdnn2 = TDNN(cout, cout, 1, 1)
        self.se_block = SqueezeExcite(cout, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


def _mean_std(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = (weights * x).sum(2)
    std = torch.sqrt((weights * (x - mean[..., None]).pow(2)).sum(2).clamp(1e-12))
    return mean, std


class AttentiveStatsPool(nn.Module):
    """Mean and std over time, weighted by a per-channel attention that sees the clip's global stats."""

    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = TDNN(channels * 3, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[-1]
        uniform = torch.full((x.shape[0], 1, frames), 1.0 / frames, dtype=x.dtype, device=x.device)
        mean, std = _mean_std(x, uniform)
        context = torch.cat([x, mean[..., None].expand(-1, -1, frames), std[..., None].expand(-1, -1, frames)], 1)
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _mean_std(x, attention)
        return torch.cat((mean, std), dim=1)[..., None]


class SpeakerEncoder(nn.Module):
    """cfg: a SpeakerEncoderConfig (omni.models.qwen3_tts.config)."""

    def __init__(self, cfg):
        super().__init__()
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        if not len(ch) == len(ks) == len(dil) or len(ch) < 3:
            raise ValueError("enc_channels, enc_kernel_sizes and enc_dilations need one entry per block (>= 3)")
        self.blocks = nn.ModuleList([TDNN(cfg.mel_dim, ch[0], ks[0], dil[0])])
        for i in range(1, len(ch) - 1):
            self.blocks.append(SERes2NetBlock(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels,
                                              ks[i], dil[i]))
        self.mfa = TDNN(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPool(ch[-1], cfg.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, cfg.enc_dim, 1)
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

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """[B, frames, mel_dim] -> [B, enc_dim]."""
        x = mels.transpose(1, 2)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x))[..., 0]

    @torch.inference_mode()
    def embed(self, pcm: np.ndarray) -> np.ndarray:
        """One clip, mono float32 at `sample_rate` (24 kHz) -> its x-vector, float32 [enc_dim]."""
        p = next(self.parameters())
        mels = log_mel(pcm, p.device)[None].to(p.dtype)
        return self(mels)[0].float().cpu().numpy()
