"""Typed stage arguments: each stage kind declares its args once, as a dataclass here or beside
its stage (families: `omni/models/<family>/stages/args.py`), and registers it with
`register_stage(kind, target, args="module:Class")`. Here too: the strict converter (`coerce_args`,
which a stage calls on a dict given in-process) and the stage-level fields rule (`resolve_args`).

These modules import no torch: the kernel checks a graph's args against them when the graph is
built (`omni.kernel.graph.stage_args`), so an unknown field or a mistyped value fails then, from
Python, a TOML / YAML file or `--set` alike. A stage reads typed fields (`self.ctx.args.max_batch`).
Stage-level settings (`max_batch`, `device`) are StageSpec fields, the same for every kind; an args
class receives the ones it names in `STAGE_FIELDS` (StageSpec field -> args field) when they are
set, else its own default applies. A class checks its ranges in `check` (raising ValueError naming
the field; call `super().check()`: mixins chain).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec

from omni.kernel.errors import GraphError


def coerce_args(cls: type, args: Any, stage: str) -> Any:
    """`args` (a dict, or already a `cls`) as a `cls` dataclass; an unknown field or a mistyped
    value is a GraphError naming the stage and the field."""
    if isinstance(args, cls):
        return args
    if dataclasses.is_dataclass(args):  # the kind is registered with another class than its stage reads
        raise GraphError(f"stage {stage!r}: its stage class reads {cls.__name__} args, the kind is registered "
                         f"with {type(args).__name__}")
    if not isinstance(args, dict):
        raise GraphError(f"stage {stage!r}: args must be a table, got {type(args).__name__}")
    known = sorted(f.name for f in dataclasses.fields(cls))
    for key in args:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise GraphError(f"stage {stage!r}: unknown args field {key!r}; {hint}{cls.__name__} takes {known}")
    try:
        return msgspec.convert(args, cls)
    except msgspec.ValidationError as exc:  # "Expected `int`, got `str` - at `$.block_size`"
        message, _, at = str(exc).partition(" - at `$.")
        raise GraphError(f"stage {stage!r}: args{'.' + at.rstrip('`') if at else ''}: {message}") from None


def resolve_args(spec: Any, cls: type | None, replica: int = 0) -> Any:
    """A StageSpec's args as its kind's `cls` (None: the free-form dict), with the stage-level fields
    the class takes (`STAGE_FIELDS`, default max_batch -> max_batch; an unset one leaves the kind's
    default; `device` is the replica's own, `spec.device_of(replica)`). `StageArgs.from_spec`
    calls it with the registered class."""
    data = dict(spec.args)
    if "max_batch" in data:
        raise GraphError(f"stage {spec.name!r}: max_batch is a stage field: set {spec.name}.max_batch, not args")
    if cls is None:
        return data if spec.max_batch is None else {**data, "max_batch": spec.max_batch}
    for name, arg in getattr(cls, "STAGE_FIELDS", {"max_batch": "max_batch"}).items():
        value = spec.device_of(replica) if name == "device" else getattr(spec, name)
        if value is None:
            continue
        if arg not in {f.name for f in dataclasses.fields(cls)}:
            raise GraphError(f"stage {spec.name!r}: its kind ({cls.__name__}) takes no {name}")
        if arg in data and data[arg] != value:
            raise GraphError(f"stage {spec.name!r}: {name}={value} and args.{arg}={data[arg]!r} are one setting; "
                             f"set only {spec.name}.{name}")
        data[arg] = value
    return coerce_args(cls, data, spec.name)


def positive(args: object, *names: str) -> None:
    for name in names:
        if getattr(args, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(args, name)}")


@dataclass
class StageArgs:
    """What every typed kind takes."""

    STAGE_FIELDS: ClassVar[dict[str, str]] = {"max_batch": "max_batch"}

    threads: int = 0  # torch intra-op threads of the stage process (see omni/stages/threads.py); 0 = torch's

    @classmethod
    def from_spec(cls, spec: Any, replica: int = 0) -> Any:
        """What the kernel calls (omni.kernel.graph.stage_args): the args of replica `replica` of a
        stage of `spec`, checked, so the kernel need not know this module."""
        return resolve_args(spec, cls, replica)

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ValueError for a value out of range (the message names the field)."""


@dataclass
class EncoderArgs(StageArgs):
    """The generic encoder stage (omni/stages/encoder.py)."""

    max_batch: int = 16  # inputs per forward
    cache_size: int = 0  # LRU entries of outputs keyed by the input's content hash; 0 = off
    cache_mb: int = 0  # and at most this many MiB of outputs in it; 0 = bounded by entries only
    out_port: str = ""  # "" = the first outgoing port (or "out")

    def check(self) -> None:
        super().check()
        positive(self, "max_batch")
        for name in ("cache_size", "cache_mb"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass
class VocoderArgs(StageArgs):
    """The generic streaming vocoder stage (omni/stages/vocoder.py)."""

    first_chunk_frames: int = 4  # frames of a request's first chunk (time to first audio)
    chunk_frames: int = 12  # frames of every later chunk
    grow_chunks: bool = False  # later chunks as long as the audio sent so far, up to chunk_frames
    max_batch: int = 0  # requests per forward; 0 = 128 with the codec on a GPU, else 8
    cuda_graphs: bool = True  # on a GPU: every chunk shape a stream meets replayed from a CUDA graph
    # on a GPU: cuDNN times its algorithms once per conv shape (at warm-up / capture) and keeps the
    # fastest. Its heuristic picks a non-tensor-core implicit GEMM of 1.2-2.4 ms a call for some chunk
    # shapes of both codecs (~14 % of the codec's GPU time at 64 streams), but timing every captured
    # shape added ~55 s to a Qwen3-TTS start-up on an H200 while the codec was not the bottleneck
    # (bench/RESULTS.md 2026-12-03): off by default
    cudnn_benchmark: bool = False

    def check(self) -> None:
        super().check()
        positive(self, "first_chunk_frames", "chunk_frames")
        if self.max_batch < 0:
            raise ValueError(f"max_batch must be >= 1 (0: by device), got {self.max_batch}")


ODE_SOLVERS = ("rk4", "euler")  # omni/stages/ode.py


@dataclass
class DiffusionArgs(StageArgs):
    """The generic diffusion stage (omni/stages/diffusion.py); sizes in the model's blocks (the
    tokens its attention groups: windows start on them). A request may override the ODE fields
    in `params["sampling"][stage name]`."""

    num_steps: int = 10  # time points of the ODE grid (num_steps - 1 intervals)
    guidance_scale: float = 0.5  # classifier-free guidance; < 1e-5: no null rows
    sway_coefficient: float = -1.0  # sway sampling of the time grid
    solver: str = "rk4"
    first_chunk_blocks: int = 2  # tokens of a stream's first window (time to first audio); 0: whole utterance
    chunk_blocks: int = 8  # tokens of every later window (the longest, with grow_chunks)
    grow_chunks: bool = True  # later chunks as long as the audio out so far, up to chunk_blocks (2, 2, 4, 8, ...)
    left_context_blocks: int = 2  # context before a chunk, in its window (its output is dropped)
    right_context_blocks: int = 1  # context after a chunk: a window waits for these tokens
    max_batch: int = 0  # windows per forward (guidance rows not counted); 0 = 32 on a GPU, else 8
    tf32: bool = True  # on CUDA, float32 matmuls and convolutions on TF32 tensor cores (False: full float32)
    cuda_graphs: bool = True  # on CUDA, each step one graph replay (diffusion_batch.py), the render too
    out_port: str = ""  # "" = the first outgoing port (or "out")

    def check(self) -> None:
        super().check()
        positive(self, "num_steps")
        if self.num_steps < 2:
            raise ValueError(f"num_steps must be >= 2, got {self.num_steps}")
        if self.solver not in ODE_SOLVERS:
            raise ValueError(f"solver must be one of {ODE_SOLVERS}, got {self.solver!r}")
        for name in ("first_chunk_blocks", "chunk_blocks", "left_context_blocks", "right_context_blocks", "max_batch"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.first_chunk_blocks and not self.chunk_blocks:
            raise ValueError("chunk_blocks must be >= 1 when streaming (first_chunk_blocks > 0)")


LOAD_FORMATS = ("auto", "safetensors", "random")


@dataclass
class WeightArgs(StageArgs):
    """How a model stage gets its weights: a checkpoint directory, or random weights drawn from its
    config (a family's `load_part` reads these); mix into a kind whose stage loads a model part."""

    model_dir: str = ""  # the checkpoint directory
    dtype: str = ""  # weights dtype, e.g. "bfloat16"; "" = the part's default
    load_format: str = "auto"  # "random": weights drawn from the config on the stage's device
    seed: int = 0  # the random weights' seed

    def check(self) -> None:
        super().check()
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format {self.load_format!r} is not one of {LOAD_FORMATS}")


MOE_BACKENDS = ("", "triton", "grouped", "bmm")


@dataclass
class LayerArgs(StageArgs):
    """Backend switches of omni/layers, applied once when the stage sets up (per process:
    `fused_ops.use_fused_ops`, `moe_routed.use_moe_backend`); mix into a kind whose model uses them."""

    moe_backend: str = ""  # routed experts: "triton" | "grouped" | "bmm"; "" = by dtype and device
    fused_ops: bool = True  # the fused Triton norm / rope / router kernels on CUDA (False: plain torch)

    def check(self) -> None:
        super().check()
        if self.moe_backend not in MOE_BACKENDS:
            raise ValueError(f"moe_backend must be one of {MOE_BACKENDS}, got {self.moe_backend!r}")
