"""Qwen2.5-Omni's BigVGAN vocoder: log-mel [N, mel_dim, T] -> 24 kHz PCM [N, T * hop].

Purely convolutional, so a mel window decodes its middle exactly as the whole utterance does once
it has `context_frames` frames of real mel on each side (the receptive field): `MelStream` (in
token2wav.py) decodes a stream chunk by chunk that way. Names follow the reference checkpoint
(under `token2wav.code2wav_bigvgan_model.`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from omni.models.qwen2_5_omni.config import BigVGANConfig
from omni.models.qwen2_5_omni.modules.alias_free import AliasFreeSnake

ACT_SAMPLES = 6  # one anti-aliased activation's reach, in samples of its rate (12-tap filters at 2x)
MIN_DB = -115.0


def _pad(kernel: int, dilation: int) -> int:
    return (kernel * dilation - dilation) // 2


class AMPBlock(nn.Module):
    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs1 = nn.ModuleList([nn.Conv1d(channels, channels, kernel, 1, dilation=d, padding=_pad(kernel, d))
                                     for d in dilations])
        self.convs2 = nn.ModuleList([nn.Conv1d(channels, channels, kernel, 1, dilation=1, padding=_pad(kernel, 1))
                                     for _ in dilations])
        self.activations = nn.ModuleList([AliasFreeSnake(channels) for _ in range(2 * len(dilations))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acts = self.activations
        for i, (c1, c2) in enumerate(zip(self.convs1, self.convs2)):
            x = x + c2(acts[2 * i + 1](c1(acts[2 * i](x))))
        return x


# the amplitude floor, float32 as the reference computes it; a Python number, so a CUDA graph can record the clamp
AMP_FLOOR = float(torch.exp(torch.tensor(MIN_DB / 20.0 * math.log(10), dtype=torch.float32)))


def normalized_db(mel: torch.Tensor) -> torch.Tensor:
    """The model's input scale: natural-log mel -> dB - 20, mapped from [-115, 0] dB to [-1, 1]."""
    db = 20 * torch.log10(torch.clamp(torch.exp(mel), min=AMP_FLOOR)) - 20
    return torch.clamp(2 * ((db - MIN_DB) / (-MIN_DB)) - 1, -1, 1)


class BigVGAN(nn.Module):
    def __init__(self, cfg: BigVGANConfig):
        super().__init__()
        self.cfg = cfg
        ch = cfg.upsample_initial_channel
        self.conv_pre = nn.Conv1d(cfg.mel_dim, ch, 7, 1, padding=3)
        self.ups = nn.ModuleList([
            nn.ModuleList([nn.ConvTranspose1d(ch >> i, ch >> (i + 1), k, r, padding=(k - r) // 2)])
            for i, (r, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes))
        ])
        self.resblocks = nn.ModuleList([
            AMPBlock(ch >> (i + 1), k, tuple(d))
            for i in range(len(cfg.upsample_rates))
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes)
        ])
        out_ch = ch >> len(cfg.upsample_rates)
        self.activation_post = AliasFreeSnake(out_ch)
        self.conv_post = nn.Conv1d(out_ch, 1, 7, 1, padding=3, bias=False)

    @property
    def hop(self) -> int:
        return self.cfg.hop

    def context_frames(self) -> int:
        """Mel frames of context on each side beyond which a sample does not see (a safe bound)."""
        cfg, rate, reach = self.cfg, 1, 3.0  # conv_pre: 7 taps
        block = max(sum(2 * ACT_SAMPLES + _pad(k, d) + _pad(k, 1) for d in dil)
                    for k, dil in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes))
        for r, k in zip(cfg.upsample_rates, cfg.upsample_kernel_sizes):
            reach += math.ceil(k / r) / rate
            rate *= r
            reach += block / rate
        reach += (ACT_SAMPLES + 3) / rate
        return math.ceil(reach) + 1

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [N, mel_dim, T] (natural log) -> PCM [N, T * hop] in [-1, 1]."""
        x = self.conv_pre(normalized_db(mel))
        n = len(self.cfg.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            x = up[0](x)
            x = sum(self.resblocks[i * n + j](x) for j in range(n)) / n
        x = self.conv_post(self.activation_post(x))
        return torch.clamp(x, -1.0, 1.0)[:, 0]
