"""Which stages, and which replica of each, a request goes through.

A stage that serves only a capability the request does not need is skipped, so its death, restart
or outage never touches that request. A stage may name the capability it serves
(`StageSpec.capability`, e.g. "image_input"); stages that name none are the core every request
needs. The graph's `needs` ("module:function", params -> the capability names the request needs)
decides per request; without one every stage is needed. A stage whose every input comes from
skipped stages is skipped too. The skip list rides in each RequestOpen, so actors open, feed and
end only the edges into stages the request uses, and count only the inputs it will get.

Which replica of a stage serves a request the kernel decides when it opens (omni/cluster/balancer.py:
least-loaded, with session affinity); the choice rides in RequestOpen.replicas (stage -> replica, a stage
of one replica left out), so every actor sends the request's Opens, chunks and ends to that replica for
its whole life; a chunk names its sender's replica (RequestChunk.src), whom its credit goes back to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omni.kernel.graph import Graph
from omni.kernel.registry import resolve
from omni.kernel.rundir import actor_name


def replica_of(stage: str, placed: dict[str, int]) -> str:
    """The actor serving a request in `stage`, by its placement (RequestOpen.replicas)."""
    return actor_name(stage, placed.get(stage, 0))


def inputs_expected(graph: Graph, stage: str, skip: list[str]) -> int:
    """How many inbound edges of `stage` a request with this skip list ends (the entry's: 1, from $in)."""
    return sum(1 for e in inputs if e.src not in skip) if (inputs := graph.incoming(stage).values()) else 1


@dataclass
class Route:
    skip: list[str]  # stages this request never enters
    stages: list[str]  # stages it uses, in graph order
    exits: set[int]  # ids of the exit edges it will end


class Router:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._needs: Callable[[dict[str, Any]], set[str]] | None = resolve(graph.needs) if graph.needs else None

    @staticmethod
    def everything(graph: Graph) -> Route:
        """The route that uses every stage (no `needs`, or one that failed)."""
        return Route([], [s.name for s in graph.stages], set(graph.exits()))

    def capabilities(self) -> dict[str, list[str]]:
        """Capability name -> the stages that serve it (core stages are in none)."""
        out: dict[str, list[str]] = {}
        for spec in (s for s in self.graph.stages if s.capability):
            out.setdefault(spec.capability, []).append(spec.name)
        return out

    def route(self, params: dict[str, Any]) -> Route:
        graph = self.graph
        if self._needs is None:
            return self.everything(graph)
        needed = set(self._needs(params))
        skip = {s.name for s in graph.stages if s.capability and s.capability not in needed and s.name != graph.entry}
        changed = True
        while changed:  # a stage fed only by skipped stages is skipped too
            changed = False
            for spec in graph.stages:
                inputs = graph.incoming(spec.name).values()
                if spec.name not in skip and spec.name != graph.entry and inputs and all(e.src in skip for e in inputs):
                    skip.add(spec.name)
                    changed = True
        stages = [s.name for s in graph.stages if s.name not in skip]
        exits = {i for i, e in graph.exits().items() if e.src not in skip}
        return Route(sorted(skip), stages, exits)
