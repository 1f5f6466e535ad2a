"""The streaming vocoder stage: codec frames in, PCM chunks out as soon as they are final.

It drives any `StreamingCodec` (a model whose per-stream state carries its left context, such
as Qwen3-Omni's code2wav). A request's first chunk is `first_chunk_frames` (time to first
audio), later ones `chunk_frames` (efficiency); at the end of input whatever is left is
decoded. Requests whose next chunk has the same shape are decoded in one batched forward;
one step launches a forward for every due shape (first chunks first) before it waits for any.

Codes arrive as arrays or as tensors. Tensors already on the codec's device stay there (with
the codec on a GPU: no per-frame host round trip): they are concatenated on the device and
range-checked once per forward, where one request's bad codes fail that request only. The
only copy back is each chunk's PCM (float32 numpy). torch is imported only when a tensor
shows up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import Emit, Stage, StageContext
from omni.stages.args import VocoderArgs, coerce_args
from omni.stages.gpu_clock import GpuClock
from omni.stages.gpu_memory import gpu_memory
from omni.stages.step_profiler import StepProfiler
from omni.stages.threads import pin_torch_threads

GPU_MAX_BATCH, CPU_MAX_BATCH = 128, 8  # on a GPU, 64+ streams' chunks in one forward


class StreamingCodec(Protocol):
    """What the stage needs of a vocoder model (torch stays inside the model)."""

    sample_rate: int
    num_groups: int
    codebook_size: int
    device: Any  # where `decode_frames` runs ("cpu", "cuda:0", a torch.device)

    def new_stream(self) -> Any: ...

    def batch_key(self, stream: Any) -> tuple: ...

    def decode_frames(self, codes: Any, streams: list[Any]) -> Any:
        """codes [B, T, num_groups] int (numpy, or a tensor on `device`; in range) -> new
        samples [B, n] (numpy, or a float32 tensor that may still be being computed);
        advances `streams`."""
        ...

    # optional: `release(stream)` (a stream's resources back: it ended), `capture_graphs(first,
    # chunk, max_batch)` (CUDA graphs of the chunk shapes), `fit_frames(n)` (the chunk length
    # <= n that decodes fastest: a stream's last frames go in those)


def _is_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def chunk_after(decoded: int, first: int, chunk: int, grow: bool) -> int:
    """The next chunk's frames once `decoded` frames went out: `first`, then `chunk`; growing,
    each chunk as long as the audio already sent (1, 1, 2, 4, 8, ... up to `chunk`), so a tiny
    first chunk gives the first audio early and the client's buffer stays ahead of the next."""
    if decoded == 0:
        return first
    return min(chunk, max(first, decoded)) if grow else chunk


def chunk_schedule(frames: int, first: int, chunk: int, grow: bool) -> list[int]:
    """The chunk sizes of a `frames`-long request (what a warm-up runs through)."""
    sizes, done = [], 0
    while done < frames:
        sizes.append(min(frames - done, chunk_after(done, first, chunk, grow)))
        done += sizes[-1]
    return sizes


def _join(blocks: list[Any], stack: bool) -> Any:
    """Concatenate (or stack) numpy blocks on the host, or tensors on their device."""
    if not any(_is_tensor(b) for b in blocks):
        return np.stack(blocks) if stack else np.concatenate(blocks, axis=0)
    import torch

    device = next(b.device for b in blocks if _is_tensor(b))
    tensors = [b if _is_tensor(b) else torch.from_numpy(b).to(device) for b in blocks]
    return torch.stack(tensors) if stack else torch.cat(tensors)


def _host_pcm(pcm: Any) -> np.ndarray:
    if _is_tensor(pcm):
        pcm = pcm.float().cpu().numpy()
    return np.asarray(pcm, dtype=np.float32)


@dataclass
class VocoderRequest:
    stream: Any
    first_chunk: int
    chunk: int
    grow: bool = False  # chunks after the first: as many frames as were sent so far, up to `chunk`
    pending: list[Any] = field(default_factory=list)  # [n, groups] blocks not yet decoded
    pending_frames: int = 0
    decoded_frames: int = 0
    closed: bool = False
    fit: Any = None  # the codec's `fit_frames`: a closed stream's last frames go in chunks it decodes fastest

    def due(self) -> int:
        """Frames to decode now (0: wait for more)."""
        need = chunk_after(self.decoded_frames, self.first_chunk, self.chunk, self.grow)
        if self.pending_frames >= need:
            return need
        if not self.closed or not self.pending_frames:
            return 0
        return self.fit(self.pending_frames) if self.fit else self.pending_frames

    def take(self, n: int) -> Any:
        frames = self.pending[0] if len(self.pending) == 1 else _join(self.pending, stack=False)
        self.pending = [frames[n:]] if n < len(frames) else []
        self.pending_frames -= n
        return frames[:n]


class VocoderStage(Stage):
    """args: `VocoderArgs` (omni/stages/args.py; a subclass names its own class in `Args`). A
    request may override the chunk sizes with params `vocoder_first_chunk_frames` /
    `vocoder_chunk_frames`. Subclasses provide the model in `build_codec`."""

    in_port = "codes"
    out_port = "audio"
    Args: type[VocoderArgs] = VocoderArgs

    def __init__(self, ctx: StageContext, codec: StreamingCodec | None = None) -> None:
        ctx.args = coerce_args(self.Args, ctx.args, ctx.name)
        super().__init__(ctx)
        self.codec = codec
        self.requests: dict[str, VocoderRequest] = {}
        self.first_chunk = ctx.args.first_chunk_frames
        self.chunk = ctx.args.chunk_frames
        self.grow = ctx.args.grow_chunks
        self._max_batch = ctx.args.max_batch or None
        self.decoded_frames = 0
        self.forwards = 0
        self.gpu_clock = GpuClock()  # on the codec's device once set up
        self.graphs = 0  # CUDA graphs the codec captured
        self.profiler = StepProfiler(f"{ctx.name}.{ctx.replica}")

    def build_codec(self) -> StreamingCodec:
        raise NotImplementedError("pass a codec or override build_codec")

    def setup(self) -> None:
        pin_torch_threads(self.ctx.args.threads)
        if self.codec is None:
            self.codec = self.build_codec()
        self.gpu_clock = GpuClock(getattr(self.codec, "device", "cpu"))
        if self.on_gpu and self.ctx.args.cudnn_benchmark:
            import torch

            torch.backends.cudnn.benchmark = True  # this process's convs; set before any warm-up or capture
        if self.on_gpu and self.ctx.args.cuda_graphs and hasattr(self.codec, "capture_graphs"):
            self.graphs = self.codec.capture_graphs(self.first_chunk, self.chunk, self.max_batch)

    @property
    def on_gpu(self) -> bool:
        return str(getattr(self.codec, "device", "cpu")).startswith("cuda")

    @property
    def max_batch(self) -> int:
        if self._max_batch is not None:
            return self._max_batch
        return GPU_MAX_BATCH if self.on_gpu else CPU_MAX_BATCH

    def open(self, rid: str, params: dict[str, Any]) -> None:
        first = _positive(params.get("vocoder_first_chunk_frames", self.first_chunk), "vocoder_first_chunk_frames")
        chunk = _positive(params.get("vocoder_chunk_frames", self.chunk), "vocoder_chunk_frames")
        self.requests[rid] = VocoderRequest(self.codec.new_stream(), first, chunk, self.grow,
                                            fit=getattr(self.codec, "fit_frames", None))

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        req = self.requests[rid]
        codes = data["codes"]
        if _is_tensor(codes) and self._keeps_on_device(codes):
            codes = self._device_block(codes)  # stays a tensor; range checked once per forward
        else:
            codes = self._host_block(codes)
        if req.closed:
            raise InvalidRequest(f"codes for {rid} after its input ended")
        if len(codes):
            req.pending.append(codes)
            req.pending_frames += len(codes)

    def _keeps_on_device(self, codes: Any) -> bool:
        import torch

        return codes.device == torch.device(getattr(self.codec, "device", "cpu"))

    def _device_block(self, codes: Any) -> Any:
        import torch

        if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
            raise InvalidRequest(f"codes must be integers, got {codes.dtype}")
        codes = codes.detach()
        codes = codes[None] if codes.dim() == 1 else codes
        self._check_shape(codes.shape)
        return codes.to(torch.long, copy=True)  # the channel's buffer is valid during the call only

    def _host_block(self, codes: Any) -> np.ndarray:
        if _is_tensor(codes):
            codes = codes.detach().cpu().numpy()
        codes = np.array(codes, copy=True)
        if codes.dtype.kind not in "iu":
            raise InvalidRequest(f"codes must be integers, got {codes.dtype}")
        codes = codes.astype(np.int64)
        codes = codes[None] if codes.ndim == 1 else codes
        self._check_shape(codes.shape)
        if codes.size and (codes.min() < 0 or codes.max() >= self.codec.codebook_size):
            raise InvalidRequest(f"codes must lie in [0, {self.codec.codebook_size})")
        return codes

    def _check_shape(self, shape) -> None:
        if len(shape) != 2 or shape[1] != self.codec.num_groups:
            raise InvalidRequest(f"codes must be [n_frames, {self.codec.num_groups}], got {list(shape)}")

    def close_input(self, rid: str) -> None:
        self.requests[rid].closed = True

    def abort(self, rid: str) -> None:
        self._end(rid)

    def _end(self, rid: str) -> None:
        """Forget a request; its stream's resources go back to the codec."""
        req = self.requests.pop(rid, None)
        release = getattr(self.codec, "release", None)
        if req is not None and release is not None:
            release(req.stream)

    def has_work(self) -> bool:
        return any(r.due() or (r.closed and not r.pending_frames) for r in self.requests.values())

    def backlog(self) -> int:
        return sum(r.pending_frames for r in self.requests.values())

    def step(self) -> list[Emit]:
        with self.profiler.step():
            return self._step()

    def _step(self) -> list[Emit]:
        emits = [Emit(rid, finish=True) for rid, r in self.requests.items() if r.closed and not r.pending_frames]
        for e in emits:
            self._end(e.rid)
        launched = []  # every forward is launched before any PCM is copied back
        self.gpu_clock.start()
        for batch in self._next_batches():
            n = self.requests[batch[0]].due()
            codes = _join([self.requests[rid].take(n) for rid in batch], stack=True)
            codes, bad = self._range_check(codes)
            reqs = [self.requests[rid] for rid in batch]
            launched.append((batch, reqs, n, self.codec.decode_frames(codes, [r.stream for r in reqs]), bad))
            self.forwards += 1
            self.decoded_frames += n * len(reqs)
        self.gpu_clock.stop()
        for batch, reqs, n, pcm, bad in launched:
            pcm = _host_pcm(pcm)  # the step's one wait for the device
            bad = bad.tolist() if bad is not None else [False] * len(batch)
            for rid, r, samples, is_bad in zip(batch, reqs, pcm, bad):
                if is_bad:
                    exc = InvalidRequest(f"codes must lie in [0, {self.codec.codebook_size})")
                    emits.append(Emit(rid, error=str(exc), error_kind=exc.kind))
                    self._end(rid)
                    continue
                r.decoded_frames += n
                done = r.closed and not r.pending_frames
                data = {"pcm": np.ascontiguousarray(samples), "sample_rate": self.codec.sample_rate}
                if len(samples) or done:
                    emits.append(Emit(rid, self.out_port, data if len(samples) else None, finish=done))
                if done:
                    self._end(rid)
        return emits

    def _range_check(self, codes: Any) -> tuple[Any, Any]:
        """Device codes are range-checked once per forward without waiting for the device: the
        rows out of the codebook are decoded clamped and flagged, and their requests fail (alone)
        when the step copies its PCM back."""
        if not _is_tensor(codes):
            return codes, None
        bad = ((codes < 0) | (codes >= self.codec.codebook_size)).flatten(1).any(1)
        return codes.clamp(0, self.codec.codebook_size - 1), bad

    def stats(self) -> dict[str, Any]:
        return {"running": len(self.requests), "buffered_frames": self.backlog(),
                "decoded_frames": self.decoded_frames, "forwards": self.forwards, "max_batch": self.max_batch,
                "graphs": self.graphs, **gpu_memory(getattr(self.codec, "device", "cpu")),
                **({"time_s": {"gpu": self.gpu_clock.seconds()}} if self.gpu_clock.on else {})}

    def _next_batches(self) -> list[list[str]]:
        """Due requests grouped by their next chunk's shape (frames and the codec's batch key: a
        first chunk shares a forward with later ones of the same shape), groups holding first
        chunks first (time to first audio), then the largest; at most `max_batch` per forward."""
        groups: dict[tuple, list[str]] = {}
        for rid, r in self.requests.items():
            n = r.due()
            if n:
                groups.setdefault((n, self.codec.batch_key(r.stream)), []).append(rid)
        first = {key for key, rids in groups.items() if any(self.requests[r].decoded_frames == 0 for r in rids)}
        order = sorted(groups.items(), key=lambda kv: (kv[0] not in first, -len(kv[1])))
        return [rids[i: i + self.max_batch] for _, rids in order for i in range(0, len(rids), self.max_batch)]


def _positive(value: Any, name: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise InvalidRequest(f"{name} must be a positive integer, got {value!r}") from None
    if number < 1:
        raise InvalidRequest(f"{name} must be a positive integer, got {value!r}")
    return number
