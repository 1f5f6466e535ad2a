"""Automatic placement of a graph's GPU stages on the GPUs of one host (`omnid serve --gpus 0,1,2`).

A pure function of the stage specs: with one GPU every GPU stage runs there (as with `--device`);
with two or more, the heaviest stage (by its `load`, one replica's memory and compute as the family
weighs it: Qwen3-Omni's thinker) gets the first GPUs to itself, one per replica, `tensor_parallel_size`
consecutive GPUs per replica when it is tensor-parallel (its ranks run on cuda:N, N+1, ...); every
other GPU stage's replicas go, heaviest first, to the least-loaded of the remaining GPUs. CPU
stages and the stages in `keep` (placed by hand) are left as they are.
"""

from __future__ import annotations

from omni.kernel.errors import GraphError
from omni.kernel.graph import Graph, StageSpec

def parse_gpus(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]; an error for an empty, negative, repeated or non-numeric entry."""
    try:
        gpus = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise GraphError(f"--gpus takes GPU indices such as 0,1,2, got {text!r}") from None
    if not gpus or min(gpus) < 0 or len(set(gpus)) != len(gpus):
        raise GraphError(f"--gpus takes distinct GPU indices such as 0,1,2, got {text!r}")
    return gpus


def tp_size(spec: StageSpec) -> int:
    return int(spec.args.get("tensor_parallel_size") or 1)


def rank_devices(device: str, size: int) -> list[str]:
    """Rank r of a tensor-parallel replica on cuda:N runs on cuda:N+r; on the CPU all are on the CPU."""
    if not device.startswith("cuda"):
        return [device] * size
    index = int(device.partition(":")[2] or 0)
    return [f"cuda:{index + r}" for r in range(size)]


def process_devices(graph: Graph) -> list[str]:
    """The device of every process the graph's stages run: one per replica, one per rank."""
    return [d for s in graph.stages for replica in s.all_devices() for d in rank_devices(replica, tp_size(s))]


def plan(stages: list[StageSpec], gpus: list[int], load: dict[str, float] | None = None,
         keep: set[str] | frozenset = frozenset()) -> dict[str, list[str]]:
    """{stage name: one device per replica} for the GPU stages (device "cuda...") not in `keep`;
    `load` ({stage: weight}) overrides the specs' own."""
    if not gpus:
        raise GraphError("placement needs at least one GPU")
    load = load or {}
    todo = [s for s in stages if s.device.startswith("cuda") and s.name not in keep]
    if not todo:
        return {}
    if len(gpus) == 1:
        return {s.name: [f"cuda:{gpus[0]}"] * s.replicas for s in todo}
    weight = {s.name: float(load.get(s.name, s.load)) for s in todo}
    anchor = max(todo, key=lambda s: weight[s.name])  # the first of the heaviest
    for spec in todo:
        if spec is not anchor and tp_size(spec) > 1:
            raise GraphError(f"stage {spec.name!r}: only the heaviest stage ({anchor.name!r}) may be "
                             "tensor-parallel under --gpus; place it by hand (--set NAME.devices=...)")
    tp = tp_size(anchor)
    need = tp * anchor.replicas
    if need > len(gpus):
        raise GraphError(f"stage {anchor.name!r}: {anchor.replicas} replica(s) x tensor_parallel_size {tp} "
                         f"need {need} GPUs, --gpus gives {len(gpus)}")
    out: dict[str, list[str]] = {anchor.name: []}
    for r in range(anchor.replicas):
        ranks = gpus[r * tp : (r + 1) * tp]
        if ranks != list(range(ranks[0], ranks[0] + tp)):
            raise GraphError(f"stage {anchor.name!r}: the ranks of a tensor-parallel replica run on consecutive "
                             f"GPUs; --gpus gives {ranks} for replica {r}")
        out[anchor.name].append(f"cuda:{ranks[0]}")
    rest = gpus[need:] or gpus  # no GPU left over: the others share the anchor's
    used = {g: (weight[anchor.name] if g in gpus[:need] else 0.0) for g in rest}
    others = sorted((s for s in todo if s is not anchor), key=lambda s: -weight[s.name])
    for spec in others:
        out[spec.name] = []
        for _ in range(spec.replicas):
            g = min(rest, key=lambda g: used[g])  # ties: the first listed
            used[g] += weight[spec.name]
            out[spec.name].append(f"cuda:{g}")
    return {s.name: out[s.name] for s in todo}  # graph order


def place(graph: Graph, gpus: list[int], load: dict[str, float] | None = None,
          keep: set[str] | frozenset = frozenset()) -> Graph:
    """Apply `plan` to `graph` (each planned stage's `devices`, and `device` = its first replica's)."""
    for name, devices in plan(graph.stages, gpus, load, keep).items():
        spec = graph.stage(name)
        spec.device, spec.devices = devices[0], devices
    graph.validate()
    return graph
