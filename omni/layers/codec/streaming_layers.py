"""Streaming building blocks of the codec decoder (`wave_decoder`): every layer is causal and
carries its left context in a `StreamBatch`, so decoding frames chunk by chunk gives the full decode.

Parameter names match the published checkpoints (Qwen3-Omni's `code2wav.`, Qwen3-TTS's
`decoder.`). A fresh state is the zero padding the full decode uses, so the full decode is one
call from a fresh state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class StreamBatch:
    """The left context of B streams decoded together, for the duration of one call.

    `tensors` hold per-layer history ([B, ...]); `pos` is each stream's frame count so far;
    `trim[key]` is how many leading samples a transposed conv still drops (the same for every
    stream of a batch); layers record in `consumed[key]` how many inputs they took.
    """

    tensors: dict[str, torch.Tensor]
    pos: torch.Tensor
    trim: dict[str, int]
    consumed: dict[str, int] = field(default_factory=dict)


class CausalConv(nn.Module):
    """Conv1d with left zero padding (stride 1): history = the last (k-1)*dilation inputs."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.context = (kernel - 1) * dilation
        self.key = ""

    def init_state(self, dtype, device) -> dict[str, torch.Tensor]:
        return {self.key: torch.zeros(1, self.conv.in_channels, self.context, dtype=dtype, device=device)}

    def forward(self, x: torch.Tensor, st: StreamBatch) -> torch.Tensor:
        if x.shape[-1] == 0:
            return x.new_zeros(x.shape[0], self.conv.out_channels, 0)
        ext = torch.cat([st.tensors[self.key], x], dim=-1)
        st.tensors[self.key] = ext[..., ext.shape[-1] - self.context:]
        return self.conv(ext)


class CausalTransConv(nn.Module):
    """ConvTranspose1d trimmed by (kernel - stride) on both sides, as in the reference (Qwen3-Omni),
    or on the right only with `trim_left=False` (Qwen3-TTS's 12 Hz decoder).

    Output sample m (untrimmed) depends on inputs i with i*s <= m < i*s + k, so after n inputs
    every m < n*s is final: a call taking inputs [n, n+T) emits untrimmed [n*s, (n+T)*s), using
    the last ceil(k/s) - 1 inputs as history; the first (k - s) samples of a stream are trimmed
    (none with `trim_left=False`: then n inputs give exactly n*s samples).
    """

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, trim_left: bool = True):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride = stride
        self.pad = kernel - stride if trim_left else 0
        self.history = math.ceil(kernel / stride) - 1
        self.key = ""

    def init_state(self, dtype, device) -> dict[str, torch.Tensor]:
        return {self.key: torch.zeros(1, self.conv.in_channels, self.history, dtype=dtype, device=device)}

    def trim_after(self, inputs_seen: int) -> int:
        return max(0, self.pad - inputs_seen * self.stride)

    def forward(self, x: torch.Tensor, st: StreamBatch) -> torch.Tensor:
        steps = x.shape[-1]
        st.consumed[self.key] = steps
        if steps == 0:
            return x.new_zeros(x.shape[0], self.conv.out_channels, 0)
        ext = torch.cat([st.tensors[self.key], x], dim=-1)
        st.tensors[self.key] = ext[..., ext.shape[-1] - self.history:]
        y = self.conv(ext)
        start = self.history * self.stride
        y = y[..., start: start + steps * self.stride]
        return y[..., st.trim[self.key]:].contiguous()


class SnakeBeta(nn.Module):
    """x + 1/exp(beta) * sin^2(x * exp(alpha)), per channel."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor, st: StreamBatch | None = None) -> torch.Tensor:
        alpha = torch.exp(self.alpha)[None, :, None]
        beta = torch.exp(self.beta)[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, st: StreamBatch) -> torch.Tensor:
        h = self.dwconv(x, st).permute(0, 2, 1)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).permute(0, 2, 1)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor, st: StreamBatch) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x), st)), st)


class DecoderBlock(nn.Module):
    """Snake, upsampling transposed conv (kernel 2r, stride r), three dilated residual units."""

    def __init__(self, cin: int, cout: int, rate: int, trim_left: bool = True):
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate, trim_left)]
            + [ResidualUnit(cout, d) for d in (1, 3, 9)]
        )

    def forward(self, x: torch.Tensor, st: StreamBatch) -> torch.Tensor:
        for layer in self.block:
            x = layer(x, st)
        return x


class UpsampleStage(nn.ModuleList):
    """Transposed conv (kernel = stride, no overlap) then a ConvNeXt block."""

    def __init__(self, dim: int, factor: int):
        super().__init__([CausalTransConv(dim, dim, factor, factor), ConvNeXtBlock(dim)])

    def forward(self, x: torch.Tensor, st: StreamBatch) -> torch.Tensor:
        for layer in self:
            x = layer(x, st)
        return x
