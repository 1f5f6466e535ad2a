"""The compute side of an actor: owns the `Stage` and is only ever called from one thread.

The mailbox (loop thread) posts `Open`, `Chunk` and `End` items and cancels into thread-safe
deques; `run_once` (compute thread) applies cancels first, hands queued inputs to the stage
while its backlog is under `max_queue`, steps it, and returns the emits plus the chunks it took
(whose credits go back to their producers). A stage that raises fails only the requests
involved; the actor lives on.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from omni.kernel.graph import Graph, stage_args
from omni.kernel.registry import STAGES
from omni.kernel.stage import Emit, StageContext

log = logging.getLogger("omni.driver")

TOMBSTONES = 4096  # finished/cancelled rids remembered so late messages are dropped


@dataclass
class Open:
    rid: str
    params: dict[str, Any]
    inputs: int  # inbound edges this request will end here (fewer when it skips stages)
    ended: set[int] = field(default_factory=set)  # the edges it has ended, once open


@dataclass
class Chunk:
    rid: str
    port: str  # the stage's input port
    data: dict[str, Any]
    edge: int  # for the credit that goes back to `producer` once the stage took the chunk
    producer: str
    tokens: list[int]


@dataclass
class End:
    rid: str
    edge: int


class StageDriver:
    def __init__(self, graph: Graph, stage: str, replica: int) -> None:
        self.spec = spec = graph.stage(stage)
        self.ctx = StageContext(spec.name, replica, stage_args(spec, replica), spec.device_of(replica),
                                in_ports=[e.dst_port for e in graph.incoming(stage).values()],
                                out_ports=sorted({e.port for e in graph.outgoing(stage).values()}))
        self.stage: Any = None
        self._inbox: collections.deque[Open | Chunk | End] = collections.deque()
        self._cancels: collections.deque[str] = collections.deque()
        self._live: dict[str, Open] = {}  # the requests open in the stage
        self._dead: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._has_work = False
        self.last_stats: dict[str, Any] = {}
        self.counts = dict.fromkeys(("completed", "aborted", "failed", "steps"), 0)
        self.step_seconds = 0.0  # wall time inside stage.step(): where a pipeline's time goes

    def setup(self) -> None:
        self.stage = STAGES.stage_class(self.spec.kind)(self.ctx)
        self.stage.setup()
        self.last_stats = self._stats()

    def teardown(self) -> None:
        if self.stage is not None:
            self.stage.teardown()

    def run_once(self) -> tuple[list[Emit], list[Chunk]]:
        """Cancels, then inputs while the stage takes them, then one step: the emits and the chunks taken."""
        emits: list[Emit] = []
        taken: list[Chunk] = []  # each owes its producer a credit, also when its request is gone
        while self._cancels:
            self._abort(self._cancels.popleft())
        while self._inbox:
            item = self._inbox[0]
            # Past max_queue the stage must first work off what it holds; a stage that holds
            # inputs yet has no work (it waits for more) is fed anyway, or it would deadlock.
            if (isinstance(item, Chunk) and item.rid in self._live and self.stage.backlog() >= self.spec.max_queue
                    and self.stage.has_work()):
                break
            self._inbox.popleft()
            if isinstance(item, Chunk):
                taken.append(item)
            if item.rid not in self._dead:
                self._apply(item, emits)
        if self.stage.has_work():
            t0 = time.perf_counter()
            try:
                emits.extend(self.stage.step())
            except Exception as exc:
                log.exception("stage %s step failed", self.spec.name)
                for rid in list(self._live):
                    emits.append(Emit(rid, error=f"{type(exc).__name__} in stage {self.spec.name}: {exc}"))
                    self._abort(rid)
            self.counts["steps"] += 1
            self.step_seconds += time.perf_counter() - t0
        for emit in emits:
            if (emit.finish or emit.error is not None) and emit.rid in self._live:
                self._retire(emit.rid)
                self.counts["failed" if emit.error is not None else "completed"] += 1
        self._has_work = self.stage.has_work()
        self.last_stats = self._stats()
        return emits, taken

    def _apply(self, item: Open | Chunk | End, emits: list[Emit]) -> None:
        rid = item.rid
        try:
            if isinstance(item, Open):
                self._live[rid] = item
                self.stage.open(rid, item.params)
            elif rid not in self._live:
                return
            elif isinstance(item, Chunk):
                self.stage.feed(rid, item.port, item.data)
            else:
                opened = self._live[rid]
                opened.ended.add(item.edge)
                if len(opened.ended) >= opened.inputs:
                    self.stage.close_input(rid)
        except Exception as exc:
            log.warning("stage %s rejected request %s: %s", self.spec.name, rid, exc,
                        exc_info=log.isEnabledFor(logging.DEBUG))
            kind = getattr(exc, "kind", "stage_failed")
            emits.append(Emit(rid, error=f"{type(exc).__name__}: {exc}", error_kind=kind))
            self._abort(rid)

    def _abort(self, rid: str) -> None:
        if rid in self._live:
            try:
                self.stage.abort(rid)
            except Exception:
                log.exception("stage %s abort(%s) failed", self.spec.name, rid)
            self.counts["aborted"] += 1
        self._retire(rid)

    def _retire(self, rid: str) -> None:
        self._live.pop(rid, None)
        self._dead[rid] = None
        while len(self._dead) > TOMBSTONES:
            self._dead.popitem(last=False)

    def _stats(self) -> dict[str, Any]:
        try:
            return {**self.stage.stats(), "backlog": self.stage.backlog()}
        except Exception as exc:
            return {"stats_error": str(exc), "backlog": 0}

    # the loop thread's side

    def post(self, item: Open | Chunk | End) -> None:
        self._inbox.append(item)

    def post_cancel(self, rid: str) -> None:
        self._cancels.append(rid)

    def is_dead(self, rid: str) -> bool:
        return rid in self._dead

    def wants_step(self) -> bool:
        # A stage past max_queue has work (else the driver feeds it), so queued inputs always
        # mean a step is due: either it feeds them or it works off the backlog first.
        return bool(self._cancels or self._has_work or self._inbox)

    def stats(self) -> dict[str, Any]:
        return {**self.last_stats, "in_flight": len(self._live), "queued_messages": len(self._inbox), **self.counts,
                "step_seconds": round(self.step_seconds, 6)}
