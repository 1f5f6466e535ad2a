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

import logging
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from omni.layers.codec.codec_graphs import BATCH_BUCKETS, CodecGraphs, frame_sizes
from omni.layers.codec.pre_transformer import PreTransformer, SlidingAttention
from omni.layers.codec.stream_slots import StreamSlots
from omni.layers.codec.streaming_layers import (
    CausalConv,
    CausalTransConv,
    DecoderBlock,
    SnakeBeta,
    StreamBatch,
    UpsampleStage,
)
from omni.layers.configs import WaveDecoderConfig

log = logging.getLogger("omni.codec")
SLOTS_GPU, SLOTS_CPU = 256, 16  # streams' contexts held at once (more: the slots double)


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
    """One stream: its row in the decoder's slots (0 until its first decode), or `tensors`, a
    detached left context ([1, ...] per layer) to start from; frames and samples so far."""

    tensors: dict[str, torch.Tensor] | None = None
    frames: int = 0
    samples: int = 0
    inputs_seen: dict[str, int] = field(default_factory=dict)  # per transposed conv
    slot: int = 0
    _release: Any = None  # returns the slot when the stream is dropped without `release`

    def fork(self) -> "WaveStream":
        """A new stream continuing from this one's snapshot (see `StreamingWaveDecoder.snapshot`)."""
        if self.slot:
            raise ValueError("fork a snapshot, not a live stream")
        return WaveStream(self.tensors, self.frames, self.samples, dict(self.inputs_seen))


class StreamingWaveDecoder(nn.Module):
    """Codes -> PCM through causal layers only: an embedding (the subclass's `build_embedding` and
    `embed`), the sliding-window pre-transformer, upsampling ConvNeXt stages and the SEANet-style
    decoder. Qwen3-Omni's code2wav and Qwen3-TTS's 12 Hz decoder are two embeddings of it.

    `width` is the convolutional width after the pre-transformer; `io_dim` (Qwen3-TTS) gives the
    pre-transformer in/out projections; `trim_left=False` trims the upsampling transposed convs on
    the right only (then T frames are exactly T * total_upsample samples, no lookahead).
    """

    graphs_class = CodecGraphs  # tests swap in a recorder that replays eagerly on the CPU

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

    def _apply(self, fn, recurse: bool = True):
        """`.to()`, `.cuda()`, `.half()` drop the stream slots and graphs: they are made again at the
        next use, in the weights' new dtype and device (a random init that decoded before its cast
        had left float32 slots beside bfloat16 weights)."""
        self._stream_slots = None
        self._graphs = None
        return super()._apply(fn, recurse)

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
        """A fresh stream; it takes a slot at its first decode and gives it back on `release`
        (or when it is dropped)."""
        return WaveStream(inputs_seen={n: 0 for n, m in self._stateful if isinstance(m, CausalTransConv)})

    def release(self, stream: WaveStream) -> None:
        """Give the stream's slot back (a finished or aborted request)."""
        if stream._release is not None:
            stream._release()
        stream.slot, stream._release = 0, None

    @torch.inference_mode()
    def snapshot(self, stream: WaveStream) -> WaveStream:
        """A detached copy of `stream` (its context cloned out of the slots) to `fork` later;
        `stream` itself is released."""
        tensors = self._slots().snapshot(stream.slot) if stream.slot else stream.tensors
        copy = WaveStream(tensors, stream.frames, stream.samples, dict(stream.inputs_seen))
        self.release(stream)
        return copy

    def _slots(self) -> StreamSlots:
        """The slots, made at first use (after the weights reached their device and dtype)."""
        if getattr(self, "_stream_slots", None) is None:
            p = next(self.parameters())
            template: dict[str, torch.Tensor] = {}
            for _, m in self._stateful:
                template.update(m.init_state(p.dtype, p.device))
            self._stream_slots = StreamSlots(template, SLOTS_GPU if p.device.type == "cuda" else SLOTS_CPU)
        return self._stream_slots

    def _seat(self, streams: list[WaveStream]) -> None:
        """Slots for the streams that have none yet, set to their start."""
        new = [s for s in streams if not s.slot]
        if not new:
            return
        slots = self._slots()
        for s, row in zip(new, slots.acquire([s.tensors for s in new])):
            s.slot, s.tensors = row, None
            s._release = weakref.finalize(s, slots.release, row)

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
        """One forward for the batch: a graph replay when its shape was captured, else eager."""
        self._seat(streams)
        meta = self._to_device(torch.tensor([[s.slot for s in streams], [s.frames for s in streams]],
                                            dtype=torch.long))
        trim = self._trim(streams[0])
        graphs = getattr(self, "_graphs", None)
        if graphs is not None and graphs.generation != self._slots().generation:
            log.warning("codec: more than %d streams at once: the slots doubled, CUDA graphs captured again",
                        self._slots().capacity // 2)
            self.capture_graphs(*self._graph_args)
            graphs = self._graphs
        if graphs is not None and graphs.has(len(streams), codes.shape[-1], trim):
            wav, consumed = graphs.run(codes, meta, trim)
        else:
            wav, consumed = self._step(codes, meta, trim)
        for s in streams:
            s.frames += codes.shape[-1]
            s.samples += wav.shape[-1]
            for key, n in consumed.items():
                s.inputs_seen[key] += n
        return wav

    def _step(self, codes: torch.Tensor, meta: torch.Tensor, trim: dict[str, int]) -> tuple[torch.Tensor, dict]:
        """Gather the rows `meta[0]` (at frame counts `meta[1]`) from the slots, decode, write
        them back: what a graph records."""
        slots = self._slots()
        st = StreamBatch(slots.gather(meta[0]), meta[1], trim)
        wav = self._forward(codes, st)
        slots.scatter(meta[0], st.tensors)
        return wav.float(), dict(st.consumed)

    def _trim(self, stream: WaveStream) -> dict[str, int]:
        return {n: m.trim_after(stream.inputs_seen[n]) for n, m in self._stateful if isinstance(m, CausalTransConv)}

    @torch.inference_mode()
    def capture_graphs(self, first_frames: int, chunk_frames: int, max_batch: int) -> int:
        """CUDA graphs for every (batch bucket <= max_batch, chunk length) a stream meets: the
        first chunk with the fresh stream's trims, `frame_sizes` with the steady ones. Returns
        how many were captured; nothing off a GPU. Short of memory (other stages share the GPU),
        the largest buckets are dropped until the rest fit; batches above them run eagerly."""
        if self.device.type != "cuda" and self.graphs_class is CodecGraphs:
            return 0
        self._graph_args = (first_frames, chunk_frames, max_batch)
        while True:
            keys, buckets = self._graph_keys(first_frames, chunk_frames, max_batch)
            self._graphs = self.graphs_class(self._step, self.cfg.num_quantizers, self.device)
            try:
                seconds = self._graphs.capture(keys, self._slots().generation)
                break
            except torch.cuda.OutOfMemoryError:
                self._graphs = None
                torch.cuda.empty_cache()
                if max_batch <= 1:
                    log.warning("codec: no memory for CUDA graphs; chunks decode eagerly")
                    return 0
                log.warning("codec: no memory for graphs of %d streams; trying %d", max_batch, max_batch // 2)
                max_batch //= 2
            except RuntimeError as exc:  # a capture the device refused: serve eagerly, never fail the stage
                self._graphs = None
                log.warning("codec: CUDA graph capture failed (%s); chunks decode eagerly", exc)
                return 0
        if not self._graphs_agree(keys[0]):
            self._graphs = None
            return 0
        log.info("codec: %d CUDA graphs in %.1f s (batches %s, chunks %s)", len(keys), seconds, buckets,
                 list(frame_sizes(first_frames, chunk_frames)))
        return len(keys)

    def _graphs_agree(self, key: tuple) -> bool:
        """One replay against the eager forward on the scratch row (same codes, same start): a
        graph that would decode differently is never used."""
        bucket, frames, trim = key
        slots = self._slots()
        codes = torch.randint(0, self.cfg.codebook_size, (bucket, self.cfg.num_quantizers, frames), device=self.device)
        meta = torch.zeros(2, bucket, dtype=torch.long, device=self.device)
        start = slots.snapshot(0)
        eager, _ = self._step(codes, meta, dict(trim))
        slots.scatter(meta[0, :1], start)
        graphed, _ = self._graphs.run(codes, meta, dict(trim))
        slots.scatter(meta[0, :1], start)
        err = (eager - graphed).abs().max().item()
        if err > 1e-2 * max(eager.abs().max().item(), 1e-3):
            log.warning("codec: CUDA graphs decode %.3g away from the eager forward; chunks decode eagerly", err)
            return False
        return True

    def _graph_keys(self, first_frames: int, chunk_frames: int, max_batch: int) -> tuple[list, list[int]]:
        fresh, steady = self.new_stream(), WaveStream(inputs_seen={n: 1 << 20 for n in self.new_stream().inputs_seen})
        buckets = [b for b in BATCH_BUCKETS if b < max_batch] + [next((b for b in BATCH_BUCKETS if b >= max_batch),
                                                                      BATCH_BUCKETS[-1])]
        keys = {(b, first_frames, tuple(sorted(self._trim(fresh).items()))) for b in buckets}
        keys |= {(b, n, tuple(sorted(self._trim(steady).items()))) for b in buckets
                 for n in frame_sizes(first_frames, chunk_frames)}
        return sorted(keys), buckets

    def fit_frames(self, frames: int) -> int:
        """The longest captured chunk <= `frames` (a stream's last chunk is decoded in those)."""
        graphs = getattr(self, "_graphs", None)
        fits = [n for n in (graphs.frames_captured() if graphs else ()) if n <= frames]
        return max(fits) if fits else frames

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
