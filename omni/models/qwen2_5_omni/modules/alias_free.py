"""BigVGAN's anti-aliased Snake activation: upsample 2x (Kaiser-windowed sinc), SnakeBeta, downsample
2x. The filters are computed, not stored (they are not in the checkpoint). On CUDA the three run as one
kernel (alias_free_fused.py)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omni.models.qwen2_5_omni.modules import alias_free_fused


def kaiser_sinc(cutoff: float, half_width: float, taps: int) -> torch.Tensor:
    """A low-pass filter [1, 1, taps] summing to 1 (Kaiser window, beta from the attenuation)."""
    half = taps // 2
    attenuation = 2.285 * (half - 1) * math.pi * 4 * half_width + 7.95
    if attenuation > 50.0:
        beta = 0.1102 * (attenuation - 8.7)
    elif attenuation >= 21.0:
        beta = 0.5842 * (attenuation - 21) ** 0.4 + 0.07886 * (attenuation - 21.0)
    else:
        beta = 0.0
    window = torch.kaiser_window(taps, beta=beta, periodic=False, dtype=torch.float32)
    t = torch.arange(-half, half) + 0.5 if taps % 2 == 0 else torch.arange(taps) - half
    taps_ = 2 * cutoff * window * torch.sinc(2 * cutoff * t)
    return (taps_ / taps_.sum()).view(1, 1, taps)


class SnakeBeta(nn.Module):
    """x + sin^2(x e^alpha) / e^beta, per channel (x [N, C, T])."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = torch.exp(self.alpha)[None, :, None]
        beta = torch.exp(self.beta)[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.pow(torch.sin(x * alpha), 2)


class UpSample(nn.Module):
    def __init__(self, ratio: int = 2, taps: int = 12):
        super().__init__()
        self.ratio, self.taps = ratio, taps
        self.pad = taps // ratio - 1
        self.crop_left = self.pad * ratio + (taps - ratio) // 2
        self.crop_right = self.pad * ratio + (taps - ratio + 1) // 2
        self.register_buffer("filter", kaiser_sinc(0.5 / ratio, 0.6 / ratio, taps), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x.shape[1]
        x = F.pad(x, (self.pad, self.pad), mode="replicate")
        x = self.ratio * F.conv_transpose1d(x, self.filter.expand(c, -1, -1), stride=self.ratio, groups=c)
        return x[..., self.crop_left: -self.crop_right]


class DownSample(nn.Module):
    def __init__(self, ratio: int = 2, taps: int = 12):
        super().__init__()
        self.ratio = ratio
        self.pads = (taps // 2 - int(taps % 2 == 0), taps // 2)
        self.register_buffer("filter", kaiser_sinc(0.5 / ratio, 0.6 / ratio, taps), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x.shape[1]
        x = F.pad(x, self.pads, mode="replicate")
        return F.conv1d(x, self.filter.expand(c, -1, -1), stride=self.ratio, groups=c)


class AliasFreeSnake(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.act = SnakeBeta(channels)
        self.upsample = UpSample()
        self.downsample = DownSample()
        self._snake_params: tuple | None = None  # (versions, exp(alpha), 1 / (exp(beta) + 1e-9)) for the fused kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if alias_free_fused.enabled(x):
            up, down = self.upsample, self.downsample
            return alias_free_fused.alias_free_snake(x, *self._fused_params(), up.filter, down.filter, up.pad,
                                                     up.crop_left, down.pads[0])
        return self.downsample(self.act(self.upsample(x)))

    def _fused_params(self) -> tuple[torch.Tensor, torch.Tensor]:
        """SnakeBeta's per-channel factors, computed once (again only if its parameters change)."""
        a, b = self.act.alpha, self.act.beta
        key = (a.data_ptr(), a._version, b.data_ptr(), b._version)
        if self._snake_params is None or self._snake_params[0] != key:
            with torch.no_grad():
                self._snake_params = (key, torch.exp(a).float(), (1.0 / (torch.exp(b) + 1e-9)).float())
        return self._snake_params[1], self._snake_params[2]
