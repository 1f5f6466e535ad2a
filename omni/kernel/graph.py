"""The graph spec: which stages run, how many replicas, and which output port feeds which stage.

A model family builds its graph in Python (omnid's config files and `--set` flags override fields:
omni/config.py). A stage kind that declares an args class (`register_stage(..., args=)`) has its
args checked whenever the graph is validated: an unknown field or a mistyped value is an error then.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from omni.kernel.errors import GraphError
from omni.kernel.registry import STAGES

OUT = "$out"  # the pseudo stage that stands for the client: edges into it are the request's outputs


@dataclass
class StageSpec:
    """One stage: its kind (registered name or `module:factory`), arguments and limits."""

    name: str
    kind: str
    args: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    replicas: int = 1
    devices: list[str] = field(default_factory=list)  # one per replica ("cuda:1", "cuda:2"); [] = all on `device`
    load: float = 1.0  # one replica's memory and compute, relative to the graph's other stages (--gpus)
    max_batch: int | None = None  # the stage's batching bound; None = its kind's default (see stage_args)
    max_queue: int = 256  # inputs the actor hands the stage before it stops feeding it
    credits: int = 64  # chunks in flight on each inbound edge
    arena_bytes: int = 64 << 20  # shm arena for this stage's outgoing payloads
    start_timeout_s: float = 120.0
    max_restarts: int = 3  # restarts within restart_window_s; past it the stage rests restart_cooldown_s
    capability: str = ""  # what the stage serves alone (e.g. "image_input"); "" = core, every request needs it
    restart_window_s: float = 60.0
    restart_cooldown_s: float = 30.0
    media: bool = False  # its RequestOpen keeps the request's media (`Graph.media` keys); the entry's always does
    resources: dict[str, float] = field(default_factory=dict)  # on a cluster (omni/cluster/ray_host.py): CPU, GPU...

    def device_of(self, replica: int) -> str:
        """Where replica `replica` runs: its entry of `devices`, else `device`."""
        return self.devices[replica] if self.devices else self.device

    def all_devices(self) -> list[str]:
        return [self.device_of(r) for r in range(self.replicas)]


@dataclass
class EdgeSpec:
    """`src.port` feeds `dst.dst_port`. `final` edges carry only what exists when src finishes."""

    src: str
    port: str
    dst: str
    dst_port: str = ""
    mode: str = "stream"  # "stream" | "final"
    channel: str = "auto"  # "auto" | "inline" | "shm" | "cuda_ipc" | "network"

    def __post_init__(self) -> None:
        self.dst_port = self.dst_port or self.port

    def __str__(self) -> str:
        return f"{self.src}.{self.port}->{self.dst}.{self.dst_port}"


@dataclass
class Graph:
    """Stages and the edges between them; an edge's id is its index in `edges`."""

    name: str
    stages: list[StageSpec]
    edges: list[EdgeSpec]
    entry: str = ""  # the stage that receives new requests; default: the first stage
    needs: str = ""  # "module:function": request params -> capability names it needs (see routing.py)
    media: list[str] = field(default_factory=list)  # params keys holding media bytes: sent only to media stages

    def __post_init__(self) -> None:
        if not self.entry and self.stages:
            self.entry = self.stages[0].name

    def stage(self, name: str) -> StageSpec:
        for spec in self.stages:
            if spec.name == name:
                return spec
        raise GraphError(f"unknown stage {name!r}; stages: {[s.name for s in self.stages]}")

    def outgoing(self, name: str) -> dict[int, EdgeSpec]:
        return {i: e for i, e in enumerate(self.edges) if e.src == name}

    def incoming(self, name: str) -> dict[int, EdgeSpec]:
        return {i: e for i, e in enumerate(self.edges) if e.dst == name}

    def exits(self) -> dict[int, EdgeSpec]:
        return self.incoming(OUT)

    def takes_media(self, name: str) -> bool:
        return name == self.entry or self.stage(name).media

    def validate(self) -> None:
        names = [s.name for s in self.stages]
        if bad := [n for n in names if "." in n or "$" in n]:
            raise GraphError(f"stage name {bad[0]!r} may not contain '.' or '$'")
        if len(set(names)) != len(names):
            raise GraphError(f"duplicate stage names in graph {self.name!r}: {names}")
        if self.entry not in names:
            raise GraphError(f"entry stage {self.entry!r} is not a stage of graph {self.name!r}")
        for edge in self.edges:
            for end in (edge.src, edge.dst):
                if end != OUT and end not in names:
                    raise GraphError(f"edge {edge} names unknown stage {end!r}")
            if edge.mode not in ("stream", "final"):
                raise GraphError(f"edge {edge}: mode must be 'stream' or 'final', not {edge.mode!r}")
        if not self.exits():
            raise GraphError(f"graph {self.name!r} has no edge into {OUT!r}: requests could never end")
        for spec in self.stages:
            if spec.replicas < 1:
                raise GraphError(f"stage {spec.name!r}: replicas must be >= 1")
            one_each = len(spec.devices) == spec.replicas and all(isinstance(d, str) for d in spec.devices)
            if spec.devices and not one_each:
                raise GraphError(f"stage {spec.name!r}: devices must name one device per replica ({spec.replicas}), "
                                 f"such as \"cuda:1\", got {spec.devices!r}")
            if spec.name != self.entry and not self.incoming(spec.name):
                raise GraphError(f"stage {spec.name!r} has no inbound edge and is not the entry")
            if spec.media and (src := [e.src for e in self.incoming(spec.name).values() if not self.takes_media(e.src)]):
                raise GraphError(f"stage {spec.name!r} takes media but {src[0]!r}, which opens it, does not")
            spec.kind = STAGES.kind_of(spec.kind)  # a former name (an alias) is read as the kind's name
            stage_args(spec)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Graph:
        return cls(**{**data, "stages": [StageSpec(**s) for s in data["stages"]],
                          "edges": [EdgeSpec(**e) for e in data["edges"]]})


def stage_args(spec: StageSpec, replica: int = 0) -> Any:
    """What replica `replica` of a stage of `spec` gets as `ctx.args`: its kind's typed args, checked
    (the registered class's `from_spec`, omni/stages/args.py), or the free-form dict of a kind that
    declares none."""
    if (cls := STAGES.stage_args_class(spec.kind)) is not None:
        return cls.from_spec(spec, replica)
    if "max_batch" in spec.args:
        raise GraphError(f"stage {spec.name!r}: max_batch is a stage field: set {spec.name}.max_batch, not args")
    return dict(spec.args) if spec.max_batch is None else {**spec.args, "max_batch": spec.max_batch}
