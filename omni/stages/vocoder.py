"""The streaming vocoder stage: codec frames in, PCM chunks out as soon as they are final.

It drives any `StreamingCodec` (a model whose per-stream state carries its left context, such
as Qwen3-Omni's code2wav). A request's first chunk is `first_chunk_frames` (time to first
audio), later ones `chunk_frames` (efficiency); at the end of input whatever is left is
decoded. Requests whose next chunk has the same shape are decoded in one batched forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import Emit, Stage, StageContext
from omni.stages.threads import pin_torch_threads


class StreamingCodec(Protocol):
    """What the stage needs of a vocoder model (torch stays inside the model)."""

    sample_rate: int
    num_groups: int
    codebook_size: int

    def new_stream(self) -> Any: ...

    def batch_key(self, stream: Any) -> tuple: ...

    def decode_frames(self, codes: np.ndarray, streams: list[Any]) -> np.ndarray:
        """codes [B, T, num_groups] int -> new samples [B, n] float32; advances `streams`."""
        ...


@dataclass
class VocoderRequest:
    stream: Any
    first_chunk: int
    chunk: int
    pending: list[np.ndarray] = field(default_factory=list)  # [n, groups] blocks not yet decoded
    pending_frames: int = 0
    decoded_frames: int = 0
    closed: bool = False

    def due(self) -> int:
        """Frames to decode now (0: wait for more)."""
        need = self.first_chunk if self.decoded_frames == 0 else self.chunk
        if self.pending_frames >= need:
            return need
        return self.pending_frames if self.closed else 0

    def take(self, n: int) -> np.ndarray:
        frames = np.concatenate(self.pending, axis=0)
        self.pending = [frames[n:]] if n < len(frames) else []
        self.pending_frames -= n
        return frames[:n]


class VocoderStage(Stage):
    """args: first_chunk_frames (default 4), chunk_frames (default 12), max_batch (default 8).
    A request may override the chunk sizes with params `vocoder_first_chunk_frames` /
    `vocoder_chunk_frames`. Subclasses provide the model in `build_codec`."""

    in_port = "codes"
    out_port = "audio"

    def __init__(self, ctx: StageContext, codec: StreamingCodec | None = None) -> None:
        super().__init__(ctx)
        self.codec = codec
        self.requests: dict[str, VocoderRequest] = {}
        self.first_chunk = _positive(ctx.args.get("first_chunk_frames", 4), "first_chunk_frames")
        self.chunk = _positive(ctx.args.get("chunk_frames", 12), "chunk_frames")
        self.max_batch = _positive(ctx.args.get("max_batch", 8), "max_batch")
        self.decoded_frames = 0
        self.forwards = 0

    def build_codec(self) -> StreamingCodec:
        raise NotImplementedError("pass a codec or override build_codec")

    def setup(self) -> None:
        pin_torch_threads(self.ctx.args)
        if self.codec is None:
            self.codec = self.build_codec()

    def open(self, rid: str, params: dict[str, Any]) -> None:
        first = _positive(params.get("vocoder_first_chunk_frames", self.first_chunk), "vocoder_first_chunk_frames")
        chunk = _positive(params.get("vocoder_chunk_frames", self.chunk), "vocoder_chunk_frames")
        self.requests[rid] = VocoderRequest(self.codec.new_stream(), first, chunk)

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        req = self.requests[rid]
        codes = data["codes"]
        if hasattr(codes, "detach"):  # a tensor (a CUDA one when the talker ran on the GPU in-process)
            codes = codes.detach().cpu().numpy()
        codes = np.array(codes, dtype=np.int64, copy=True)
        if codes.ndim == 1:
            codes = codes[None]
        if codes.ndim != 2 or codes.shape[1] != self.codec.num_groups:
            raise InvalidRequest(f"codes must be [n_frames, {self.codec.num_groups}], got {list(codes.shape)}")
        if codes.size and (codes.min() < 0 or codes.max() >= self.codec.codebook_size):
            raise InvalidRequest(f"codes must lie in [0, {self.codec.codebook_size})")
        if req.closed:
            raise InvalidRequest(f"codes for {rid} after its input ended")
        if len(codes):
            req.pending.append(codes)
            req.pending_frames += len(codes)

    def close_input(self, rid: str) -> None:
        self.requests[rid].closed = True

    def abort(self, rid: str) -> None:
        self.requests.pop(rid, None)

    def has_work(self) -> bool:
        return any(r.due() or (r.closed and not r.pending_frames) for r in self.requests.values())

    def backlog(self) -> int:
        return sum(r.pending_frames for r in self.requests.values())

    def step(self) -> list[Emit]:
        emits = [Emit(rid, finish=True) for rid, r in self.requests.items() if r.closed and not r.pending_frames]
        for e in emits:
            del self.requests[e.rid]
        batch = self._next_batch()
        if batch:
            n = self.requests[batch[0]].due()
            reqs = [self.requests[rid] for rid in batch]
            codes = np.stack([r.take(n) for r in reqs])
            pcm = self.codec.decode_frames(codes, [r.stream for r in reqs])
            self.forwards += 1
            self.decoded_frames += n * len(reqs)
            for rid, r, samples in zip(batch, reqs, pcm):
                r.decoded_frames += n
                done = r.closed and not r.pending_frames
                data = {"pcm": np.ascontiguousarray(samples, dtype=np.float32), "sample_rate": self.codec.sample_rate}
                if len(samples) or done:
                    emits.append(Emit(rid, self.out_port, data if len(samples) else None, finish=done))
                if done:
                    del self.requests[rid]
        return emits

    def stats(self) -> dict[str, Any]:
        return {"running": len(self.requests), "buffered_frames": self.backlog(),
                "decoded_frames": self.decoded_frames, "forwards": self.forwards}

    def _next_batch(self) -> list[str]:
        """The largest group of due requests whose next chunk has one shape (oldest group on ties)."""
        groups: dict[tuple, list[str]] = {}
        for rid, r in self.requests.items():
            n = r.due()
            if n:
                groups.setdefault((n, self.codec.batch_key(r.stream)), []).append(rid)
        if not groups:
            return []
        best = max(groups.values(), key=len)
        return best[: self.max_batch]


def _positive(value: Any, name: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise InvalidRequest(f"{name} must be a positive integer, got {value!r}") from None
    if number < 1:
        raise InvalidRequest(f"{name} must be a positive integer, got {value!r}")
    return number
