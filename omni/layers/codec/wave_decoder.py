"""The streaming codec decoder (codec frames -> 24 kHz PCM), shared by every family whose codec
decodes through causal layers: Qwen3-Omni's code2wav and Qwen3-TTS's 12 Hz decoder are two
embeddings in front of it (each family's `build_embedding` / `embed`).

Every part is causal, so each layer keeps its left context in a per-stream state (`WaveStream`)
and `decode` turns the next frames of several streams into exactly the samples the full decode
would have there. Decoding all frames from a fresh state *is* the full decode. N frames always
yield N * total_upsample - lookahead samples: the overlapping transposed convolutions hold back
their last samples until the next frame arrives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import numpy as np
import torch
from torch import nn

from omni.layers.codec.pre_transformer import PreTransformer, SlidingAttention
from omni.layers.codec.streaming_layers import (
    CausalConv,
    CausalTransConv,
    DecoderBlock,
    SnakeBeta,
    StreamBatch,
    UpsampleStage,
)
from omni.layers.configs import WaveDecoderConfig


def samples_for(cfg: WaveDecoderConfig, frames: int) -> int:
    """Samples a full decode of `frames` frames yields: each overlapping transposed conv
    (kernel 2r, stride r) turns n inputs into (n - 1) * r outputs."""
    n = frames
    for r in cfg.upsampling_ratios:
        n *= r
    for r in cfg.upsample_rates:
        n = max(0, (n - 1) * r)
    return n


@dataclass
class WaveStream:
    """One stream's left context: layer histories ([1, ...] tensors), frames and samples so far."""

    tensors: dict[str, torch.Tensor]
    frames: int = 0
    samples: int = 0
    inputs_seen: dict[str, int] = field(default_factory=dict)  # per transposed conv


class StreamingWaveDecoder(nn.Module):
    """Codes -> PCM through causal layers only: an embedding (the subclass's `build_embedding` and
    `embed`), the sliding-window pre-transformer, upsampling ConvNeXt stages and the SEANet-style
    decoder. Qwen3-Omni's code2wav and Qwen3-TTS's 12 Hz decoder are two embeddings of it.

    `width` is the convolutional width after the pre-transformer; `io_dim` (Qwen3-TTS) gives the
    pre-transformer in/out projections; `trim_left=False` trims the upsampling transposed convs on
    the right only (then T frames are exactly T * total_upsample samples, no lookahead).
    """

    def __init__(self, cfg, width: int, io_dim: int | None = None, trim_left: bool = True):
        super().__init__()
        self.cfg = cfg
        self.trim_left = trim_left
        self.pre_transformer = PreTransformer(cfg, io_dim)
        self.build_embedding()
        self.upsample = nn.ModuleList([UpsampleStage(width, f) for f in cfg.upsampling_ratios])
        dims = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        if dims[-1] < 1:
            raise ValueError(f"decoder_dim {cfg.decoder_dim} too small for {len(cfg.upsample_rates)} blocks")
        decoder: list[nn.Module] = [CausalConv(width, cfg.decoder_dim, 7)]
        decoder += [DecoderBlock(dims[i], dims[i + 1], r, trim_left) for i, r in enumerate(cfg.upsample_rates)]
        decoder += [SnakeBeta(dims[-1]), CausalConv(dims[-1], 1, 7)]
        self.decoder = nn.ModuleList(decoder)
        self._stateful = [
            (name, m) for name, m in self.named_modules()
            if isinstance(m, (CausalConv, CausalTransConv, SlidingAttention))
        ]
        for name, m in self._stateful:
            m.key = name

    def build_embedding(self) -> None:
        raise NotImplementedError

    def embed(self, codes: torch.Tensor, st: StreamBatch) -> torch.Tensor:
        """codes [B, num_quantizers, T] -> the pre-transformer's input [B, T, D]."""
        raise NotImplementedError

    @property
    def sample_rate(self) -> int:
        return self.cfg.sample_rate

    @property
    def codebook_size(self) -> int:
        return self.cfg.codebook_size

    @property
    def num_groups(self) -> int:
        return self.cfg.num_quantizers

    @property
    def samples_per_frame(self) -> int:
        return self.cfg.total_upsample

    @property
    def lookahead(self) -> int:
        """Samples of the last decoded frame held back until the next frame (or never)."""
        return self.samples_per_frame - self.samples_for(1)

    def samples_for(self, frames: int) -> int:
        """Samples the full decode of `frames` frames yields."""
        if not self.trim_left:
            return frames * self.samples_per_frame
        return samples_for(self.cfg, frames)

    def new_stream(self) -> WaveStream:
        p = next(self.parameters())
        tensors: dict[str, torch.Tensor] = {}
        for _, m in self._stateful:
            tensors.update(m.init_state(p.dtype, p.device))
        return WaveStream(tensors, inputs_seen={n: 0 for n, m in self._stateful if isinstance(m, CausalTransConv)})

    def batch_key(self, stream: WaveStream) -> tuple[int, ...]:
        """Streams with equal keys (and equal frame counts) can be decoded in one batch."""
        return tuple(m.trim_after(stream.inputs_seen[n]) for n, m in self._stateful
                     if isinstance(m, CausalTransConv))

    @property
    def device(self) -> torch.device:
        return self.pre_transformer.norm.weight.device

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor, streams: list[WaveStream]) -> torch.Tensor:
        """Decode the next frames of each stream. codes: [B, num_quantizers, T] (long), one row per
        stream, all with equal `batch_key`. Returns the new samples [B, n]; updates `streams`."""
        self._check_batch(codes, streams)
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.cfg.codebook_size):
            raise ValueError(f"codes outside [0, {self.cfg.codebook_size})")
        return self._decode(self._to_device(codes), streams)

    @torch.inference_mode()
    def decode_frames(self, codes, streams: list[WaveStream]) -> torch.Tensor:
        """The `StreamingCodec` entry: codes [B, T, groups] int (numpy, or a tensor), already
        range-checked by the stage -> new samples [B, n] float32 on the device. No host sync:
        the caller's copy of the samples is the only one."""
        if not isinstance(codes, torch.Tensor):
            codes = torch.from_numpy(np.asarray(codes, dtype=np.int64))
        codes = self._to_device(codes.long()).transpose(1, 2)
        self._check_batch(codes, streams)
        return self._decode(codes, streams).float()

    def _check_batch(self, codes: torch.Tensor, streams: list[WaveStream]) -> None:
        if codes.dim() != 3 or codes.shape[1] != self.cfg.num_quantizers or codes.shape[0] != len(streams):
            raise ValueError(f"codes must be [{len(streams)}, {self.cfg.num_quantizers}, T], got {tuple(codes.shape)}")
        if len({self.batch_key(s) for s in streams}) != 1:
            raise ValueError("streams at different start-up stages cannot share a batch")

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Host -> GPU without a stream sync (pinned, non-blocking); a no-op on the device."""
        if t.device == self.device:
            return t
        if self.device.type == "cuda" and t.device.type == "cpu":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    def _decode(self, codes: torch.Tensor, streams: list[WaveStream]) -> torch.Tensor:
        st = self._stack(streams)
        wav = self._forward(codes, st)
        self._unstack(st, streams, codes.shape[-1], wav.shape[-1])
        return wav

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """The full decode: [B, num_quantizers, T] -> [B, 1, samples_for(T)], like transformers'."""
        return self.decode(codes, [self.new_stream() for _ in range(codes.shape[0])])[:, None]

    def _forward(self, codes: torch.Tensor, st: StreamBatch) -> torch.Tensor:
        hidden = self.embed(codes, st)
        hidden = self.pre_transformer(hidden, st).permute(0, 2, 1)
        for stage in self.upsample:
            hidden = stage(hidden, st)
        for layer in self.decoder:
            hidden = layer(hidden, st)
        return hidden[:, 0].clamp(min=-1, max=1)

    def _stack(self, streams: list[WaveStream]) -> StreamBatch:
        tensors = {k: torch.cat([s.tensors[k] for s in streams]) for k in streams[0].tensors}
        pos = self._to_device(torch.tensor([s.frames for s in streams], dtype=torch.long))
        trim = {n: m.trim_after(streams[0].inputs_seen[n]) for n, m in self._stateful
                if isinstance(m, CausalTransConv)}
        return StreamBatch(tensors, pos, trim)

    def _unstack(self, st: StreamBatch, streams: list[WaveStream], frames: int, samples: int) -> None:
        for b, s in enumerate(streams):
            s.tensors = {k: v[b:b + 1].clone() for k, v in st.tensors.items()}
            s.frames += frames
            s.samples += samples
            for key, n in st.consumed.items():
                s.inputs_seen[key] += n
