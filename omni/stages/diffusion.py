"""The diffusion stage: a flow-matching model's ODE solved for many streams, one forward per step.

Each stream's tokens are solved window by window (diffusion_windows.py: chunks with left and right
context, aligned to the model's attention blocks), each window from the stream's own noise. Every
running window sits in a slot of one `WindowBatch` (diffusion_batch.py) per solver: a step asks the
solver (ode.py) for each window's point, whatever step or sub-step it is at, evaluates all of them
in one forward (each window's conditional row and its null row), combines each pair by guidance
(v_c + (v_c - v_null) * scale; an unguided window's scale is 0) and folds the velocity in; on CUDA
that whole step is one CUDA-graph replay. The host keeps only counters per window (ode.Progress).
Windows finished in a step go out together, as the model renders them (`render`, e.g. through a
vocoder, in one batched call), else as the latents themselves.

Noise: a request's `seed` draws its noise as `torch.manual_seed(seed); torch.randn(...)` would, on
the CPU in float32, frame after frame (see `NoiseStream`), so a seed reproduces a reference that
draws the whole utterance's noise at once; no seed: a random one.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import Emit, Stage, StageContext
from omni.sampling import Sampling
from omni.stages.args import DiffusionArgs, coerce_args
from omni.stages.diffusion_windows import Chunking, Window
from omni.stages.gpu_clock import GpuClock
from omni.stages.gpu_memory import gpu_memory
from omni.stages.step_profiler import StepProfiler
from omni.stages.ode import Progress, solver_named, time_grid
from omni.stages.threads import pin_torch_threads

if TYPE_CHECKING:  # torch only with a model
    from omni.stages.diffusion_batch import WindowBatch

log = logging.getLogger("omni.diffusion")

GPU_MAX_BATCH, CPU_MAX_BATCH = 32, 8
ODE_FIELDS = ("num_steps", "guidance_scale", "sway_coefficient", "solver")


class DiffusionModel(Protocol):
    """What the stage needs of a model (torch stays inside it)."""

    latent_dim: int
    frames_per_token: int  # latent frames per input token
    align_tokens: int  # windows start on multiples of this
    max_frames: int  # the longest window
    codebook_size: int  # tokens lie in [0, codebook_size)
    pad_frames: int  # rows of one forward are padded at their end to multiples of this
    feature_dim: int  # `features`' width
    feature_dtype: Any
    device: Any

    def new_stream(self, params: dict[str, Any]) -> Any:
        """Per-request state (its conditioning); raises InvalidRequest for bad params."""
        ...

    def features(self, stream: Any, tokens: Any, guided: bool) -> tuple[Any, Any]:
        """tokens [n] int64 tensor -> the fixed input of the window's rows, [n * frames_per_token, F]
        conditional and null (None when not guided)."""
        ...

    def velocity(self, x: Any, t: Any, feats: Any, lengths: Any) -> Any:
        """x [N, T, latent_dim] at times t [N] with feats [N, T, F] -> [N, T, latent_dim]; row i's
        first lengths[i] frames are real, the rest padding they must not see."""
        ...

    # optional: render(streams, latents [T_i, latent_dim] or None, lasts) -> [dict | None] (what goes
    # out for each stream's chunk, all in one call); prepare(chunk_frames, max_streams) -> int (CUDA
    # graphs of what render meets for chunks of these lengths, captured at start-up); release(stream)


class NoiseStream:
    """A stream's initial noise, drawn on demand frame by frame from its own CPU generator.

    torch's CPU normal fill draws blocks of 16 values, so consecutive draws of n * dim values
    concatenate to one draw of the total when dim is a multiple of 16 (the published mel_dim is 80);
    otherwise the longest utterance's noise is drawn at once and sliced."""

    def __init__(self, seed: int, dim: int, max_frames: int) -> None:
        import torch

        self.dim, self.max_frames = dim, max_frames
        self.generator = torch.Generator().manual_seed(seed)
        self.frames = torch.empty(0, dim)

    def upto(self, frames: int) -> Any:
        """Frames [0, frames) of the noise, [frames, dim] float32 (CPU)."""
        import torch

        have = self.frames.shape[0]
        if frames > have:
            n = frames - have if self.dim % 16 == 0 else self.max_frames - have
            more = torch.randn([1, n, self.dim], dtype=torch.float32, generator=self.generator)[0]
            self.frames = torch.cat([self.frames, more])
        return self.frames[:frames]


@dataclass
class Running:
    """One window in flight: its slot in the solver's batch and its place on its time grid."""

    window: Window
    solver: str
    slot: int
    progress: Progress
    scale: float  # guidance (0: unguided)


@dataclass
class DiffusionRequest:
    stream: Any
    noise: NoiseStream
    ode: dict[str, Any]
    tokens: list[Any] = field(default_factory=list)  # int64 blocks: numpy, or torch where they came so
    on_device: bool = False  # torch-fed codes: range checked on the device, a window at a time
    bad: Any = None  # the running window's device flag: a token out of [0, codebook_size) (read as it ends)
    received: int = 0
    done: int = 0  # tokens whose chunks went out
    closed: bool = False
    running: Running | None = None
    flushed: bool = False  # the model rendered the stream's last chunk


class DiffusionStage(Stage):
    """args: `DiffusionArgs` (omni/stages/args.py; a subclass names its own in `Args` and builds its
    model in `build_model`)."""

    in_port = "codes"
    Args: type[DiffusionArgs] = DiffusionArgs

    def __init__(self, ctx: StageContext, model: DiffusionModel | None = None) -> None:
        ctx.args = coerce_args(self.Args, ctx.args, ctx.name)
        super().__init__(ctx)
        self.model = model
        self.requests: dict[str, DiffusionRequest] = {}
        self.out_port = ctx.args.out_port or (ctx.out_ports[0] if ctx.out_ports else "out")
        self.forwards = 0
        self.rows = 0  # rows evaluated (guidance rows included)
        self.gpu_clock = GpuClock()  # on the model's device once set up
        self.profiler = StepProfiler(f"{ctx.name}.{ctx.replica}")

    def build_model(self) -> DiffusionModel:
        raise NotImplementedError("pass a model or override build_model")

    def setup(self) -> None:
        pin_torch_threads(self.ctx.args.threads)
        if self.model is None:
            self.model = self.build_model()
        self._ready()

    def _ready(self) -> None:
        a, m = self.ctx.args, self.model
        self.chunking = Chunking.in_blocks(m.align_tokens, a.first_chunk_blocks, a.chunk_blocks,
                                           a.left_context_blocks, a.right_context_blocks, a.grow_chunks)
        on_gpu = str(getattr(m, "device", "cpu")).startswith("cuda")
        self.max_batch = a.max_batch or (GPU_MAX_BATCH if on_gpu else CPU_MAX_BATCH)
        self.gpu_clock = GpuClock(getattr(m, "device", "cpu"))
        if on_gpu and a.tf32:
            import torch

            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # this stage's process
        c = self.chunking
        self.longest = c.longest_window * m.frames_per_token
        self.batches: dict[str, WindowBatch] = {}
        self.slots: dict[str, list[Running | None]] = {}
        n = self._batch(a.solver).capture_all()  # the default solver's steps, graphed on CUDA
        if n:
            log.info("%s: %d step CUDA graphs captured in %.1f s", self.ctx.name, n, self.batches[a.solver].capture_seconds)
        prepare = getattr(m, "prepare", None)
        if prepare is not None and a.cuda_graphs and c.first_chunk:
            n = prepare([size * m.frames_per_token for size in c.schedule(6)], self.max_batch)
            if n:
                log.info("%s: %d render CUDA graphs captured", self.ctx.name, n)

    def _batch(self, solver: str) -> WindowBatch:
        """The slots of `solver`'s windows (made on first use; torch imported only with a model)."""
        if solver not in self.batches:
            from omni.stages.diffusion_batch import WindowBatch

            self.batches[solver] = WindowBatch(self.model, solver_named(solver), self.max_batch, self.longest,
                                               self.ctx.args.cuda_graphs)
            self.slots[solver] = [None] * self.max_batch
        return self.batches[solver]

    # ---- requests -------------------------------------------------------------------
    def open(self, rid: str, params: dict[str, Any]) -> None:
        if not hasattr(self, "chunking"):
            self._ready()
        ode = {k: getattr(self.ctx.args, k) for k in ODE_FIELDS}
        given = (params.get("sampling") or {}).get(self.ctx.name) or {}
        if isinstance(given, Sampling):  # as the bus carries it: OpenAI's fields (of which the seed applies here)
            given = given.given()
        ode.update({k: v for k, v in given.items() if k in ODE_FIELDS + ("seed",)})
        seed = ode.pop("seed", params.get("seed"))
        if int(ode["num_steps"]) < 2:
            raise InvalidRequest(f"num_steps must be >= 2, got {ode['num_steps']}")
        try:
            solver_named(str(ode["solver"]))
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        seed = random.getrandbits(63) if seed is None else int(seed)
        self.requests[rid] = DiffusionRequest(self.model.new_stream(params),
                                              NoiseStream(seed, self.model.latent_dim, self.model.max_frames), ode)

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        req = self.requests[rid]
        if req.closed:
            raise InvalidRequest(f"tokens for {rid} after its input ended")
        codes = data["codes"]
        on_torch = type(codes).__module__.startswith("torch")
        if on_torch:  # kept where it is: no copy to the host (a sync behind the forward in flight)
            import torch

            if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
                raise InvalidRequest(f"codes must be integers, got {codes.dtype}")
        else:
            codes = np.array(codes, copy=True)
            if codes.dtype.kind not in "iu":
                raise InvalidRequest(f"codes must be integers, got {codes.dtype}")
        if codes.ndim == 2 and codes.shape[1] == 1:
            codes = codes[:, 0]
        if codes.ndim > 1:
            raise InvalidRequest(f"codes must be [n] or [n, 1], got {list(codes.shape)}")
        n = int(codes.shape[0]) if codes.ndim else 1
        if (req.received + n) * self.model.frames_per_token > self.model.max_frames:
            raise InvalidRequest(f"more than {self.model.max_frames // self.model.frames_per_token} tokens")
        if on_torch:  # one copy (the channel's buffer is valid during the call only); range checked per window
            codes = codes.detach().reshape(-1).to(torch.int64, copy=True)
            req.on_device = True
        else:
            codes = codes.reshape(-1).astype(np.int64)
            if codes.size and (codes.min() < 0 or codes.max() >= self.model.codebook_size):
                raise InvalidRequest(self._range_error())
        req.tokens.append(codes)
        req.received += n

    def _range_error(self) -> str:
        return f"codes must lie in [0, {self.model.codebook_size})"

    def close_input(self, rid: str) -> None:
        self.requests[rid].closed = True

    def abort(self, rid: str) -> None:
        req = self.requests.pop(rid, None)
        if req is not None and req.running is not None:
            self.slots[req.running.solver][req.running.slot] = None
        release = getattr(self.model, "release", None)
        if req is not None and release is not None:
            release(req.stream)

    # ---- stepping -------------------------------------------------------------------
    def has_work(self) -> bool:
        return any(r.running or self._next(r) or (r.closed and r.done >= r.received)
                   for r in self.requests.values())

    def backlog(self) -> int:
        """Windows that can run now (one forward takes up to `max_batch` of them). Tokens waiting for
        their window's right context are not work: counted, they stopped the actor feeding (past
        `max_queue`) while those windows waited for exactly the tokens held back, and the producer
        upstream stalled on credits; counted in tokens, runnable windows capped every forward at
        ~max_queue / 36 tokens = 8 windows (H200, 2026-12-04: 16 streams ran ~1.5 windows a forward,
        then 64 streams ~9; bench/RESULTS.md)."""
        return sum(req.running is not None or self._next(req) is not None for req in self.requests.values())

    def step(self) -> list[Emit]:
        with self.profiler.step():
            self.gpu_clock.start()
            try:
                return self._step()
            finally:
                self.gpu_clock.stop()

    def _step(self) -> list[Emit]:
        emits: list[Emit] = []
        for rid, req in list(self.requests.items()):
            if req.running is None and req.closed and req.done >= req.received:
                emits.append(Emit(rid, self.out_port, self._flush(req), finish=True))
                self.abort(rid)
        self._seat_runnable()
        for solver, slots in self.slots.items():
            if any(slots):
                self._evaluate(solver, slots)
        done = [(rid, req) for rid, req in self.requests.items() if req.running is not None and req.running.progress.done]
        return emits + (self._finish(done) if done else [])

    def _next(self, req: DiffusionRequest) -> Window | None:
        return self.chunking.next_window(req.done, req.received, req.closed) if req.running is None else None

    def _seat_runnable(self) -> None:
        """Runnable windows into free slots, streams' first windows first (time to first audio)."""
        waiting = [(req.done > 0, i, req, w) for i, req in enumerate(self.requests.values())
                   if (w := self._next(req)) is not None]
        for _, _, req, window in sorted(waiting, key=lambda e: e[:2]):
            solver = str(req.ode["solver"])
            self._batch(solver)
            slots = self.slots[solver]
            slot = next((i for i, r in enumerate(slots) if r is None), None)
            if slot is not None:
                req.running = slots[slot] = self._start(req, window, slot)

    def _start(self, req: DiffusionRequest, window: Window, slot: int) -> Running:
        m, fpt, solver = self.model, self.model.frames_per_token, str(req.ode["solver"])
        tokens = self._window_tokens(req, window)
        if req.on_device:  # not checked yet: lookups stay in range, the request fails as the window ends
            req.bad = ((tokens < 0) | (tokens >= m.codebook_size)).any()
            tokens = tokens.clamp(0, m.codebook_size - 1)
        scale = float(req.ode["guidance_scale"])
        guided = scale >= 1e-5
        feats, null = m.features(req.stream, tokens, guided=guided)
        x0 = req.noise.upto(window.end * fpt)[window.start * fpt:]
        self._batch(solver).seat(slot, x0, feats, null)
        times = time_grid(int(req.ode["num_steps"]), req.ode["sway_coefficient"])
        return Running(window, solver, slot, Progress(solver_named(solver), times), scale if guided else 0.0)

    def _window_tokens(self, req: DiffusionRequest, window: Window) -> Any:
        """The window's tokens on the model's device. Host-fed tokens stay one numpy array and only the
        window's go over, in one copy that does not wait for the GPU; device-fed ones join on the device."""
        import torch

        device = torch.device(self.model.device)
        if all(isinstance(t, np.ndarray) for t in req.tokens):
            if len(req.tokens) > 1:
                req.tokens = [np.concatenate(req.tokens)]
            host = torch.from_numpy(req.tokens[0][window.start:window.end])
            return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host
        if len(req.tokens) > 1 or not isinstance(req.tokens[0], torch.Tensor):
            req.tokens = [torch.cat([torch.as_tensor(t).to(device) for t in req.tokens])]
        return req.tokens[0][window.start:window.end]

    def _evaluate(self, solver: str, slots: list[Running | None]) -> None:
        """One forward for every window in `solver`'s slots."""
        n = max(i for i, r in enumerate(slots) if r is not None) + 1
        rows = np.zeros((n, 4), dtype=np.float32)
        frames = 0
        for i, r in enumerate(slots[:n]):
            if r is not None:
                t, h, stage = r.progress.now()
                rows[i] = (t, h, stage, r.scale)
                frames = max(frames, r.window.tokens * self.model.frames_per_token)
        self.batches[solver].step(rows, frames)
        self.forwards += 1
        self.rows += 2 * n
        for r in slots[:n]:
            if r is not None:
                r.progress.advance()

    def _finish(self, done: list[tuple[str, DiffusionRequest]]) -> list[Emit]:
        """The windows that finished this step: range errors (one read for all), then every chunk
        rendered in one call."""
        fpt, emits = self.model.frames_per_token, []
        flagged = [req for _, req in done if req.bad is not None]
        if flagged:
            import torch

            bad = dict(zip(map(id, flagged), torch.stack([r.bad for r in flagged]).tolist()))
        out = []
        for rid, req in done:
            run = req.running
            req.running, w = None, run.window
            self.slots[run.solver][run.slot] = None
            if req.bad is not None and bad[id(req)]:
                self.abort(rid)
                emits.append(Emit(rid, error=self._range_error(), error_kind=InvalidRequest.kind))
                continue
            latent = self.batches[run.solver].value(run.slot, (w.chunk_start - w.start) * fpt,
                                                    (w.chunk_end - w.start) * fpt)
            req.done, req.flushed = w.chunk_end, w.last
            out.append((rid, req, latent, w.last))
        render = getattr(self.model, "render", None)
        if render is not None and out:
            datas = render([req.stream for _, req, _, _ in out], [lat for _, _, lat, _ in out], [la for *_, la in out])
        else:
            datas = [{"latent": lat.float().cpu().numpy()} for _, _, lat, _ in out]
        return emits + [Emit(rid, self.out_port, data) for (rid, *_), data in zip(out, datas) if data is not None]

    def _flush(self, req: DiffusionRequest) -> dict[str, Any] | None:
        """What a model holds back of a stream whose last chunk was not known to be last."""
        render = getattr(self.model, "render", None)
        if render is None or req.flushed or not req.done:
            return None
        return render([req.stream], [None], [True])[0]

    def stats(self) -> dict[str, Any]:
        device = getattr(self.model, "device", "cpu")
        return {"running": len(self.requests), "buffered_tokens": self.backlog(), "forwards": self.forwards,
                "rows": self.rows, "max_batch": self.max_batch, **gpu_memory(device),
                **{k: v for b in self.batches.values() for k, v in b.stats().items()},
                **({"time_s": {"gpu": self.gpu_clock.seconds()}} if self.gpu_clock.on else {})}
