"""The AR stage's typed args: the engine's settings (`EngineConfig`) plus the stage's own.

Torch-free (the kernel checks a graph's args against it). The stage-level `max_batch` is the
engine's `max_num_seqs` (set one of them), and the stage's `device` is the engine's device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from omni.stages.args import StageArgs
from omni.stages.ar.config import EngineConfig

BACKENDS = ("builtin", "sglang")


@dataclass
class ARArgs(StageArgs, EngineConfig):
    """`ARStage` (omni/stages/ar/stage.py); every EngineConfig field is an arg too."""

    STAGE_FIELDS: ClassVar[dict[str, str]] = {"max_batch": "max_num_seqs", "device": "device"}

    model_dir: str = ""  # the checkpoint directory, for stages that load one
    backend: str = "builtin"  # "builtin" (AREngine) or "sglang" (SGLang's engine in the stage process)
    model_factory: Any = None  # a callable or "module:attr" called with the stage context (no build_model)
    default_sampling: dict[str, Any] = field(default_factory=dict)  # sampling under each request's own
    load_format: str = "auto"  # "random": the model draws random weights (SGLang: its "dummy" format)
    sglang_model_path: str = ""  # the checkpoint SGLang loads; "" = the stage's model_dir
    sglang_mem_fraction: float = 0.7  # SGLang's mem_fraction_static: room for the other stages on the GPU
    sglang_args: dict[str, Any] = field(default_factory=dict)  # more sglang.Engine arguments

    def check(self) -> None:  # `backend` is checked at set-up: where sglang is, or is not, installed
        super().check()
        EngineConfig.__post_init__(self)

    def engine_config(self, **overrides: Any) -> EngineConfig:
        """The engine's settings out of these args."""
        names = EngineConfig.__dataclass_fields__
        return EngineConfig(**{**{n: getattr(self, n) for n in names}, **overrides})
