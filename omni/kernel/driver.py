"""The compute side of an actor: owns the `Stage` and is only ever called from one thread.

The mailbox (loop thread) posts events into a thread-safe deque; `run_once` (compute thread)
applies cancels first, hands queued inputs to the stage while its backlog is under
`max_queue`, steps it, and returns the emits plus the credits to send back. A stage that
raises fails only the requests involved; the actor lives on.
"""

from __future__ import annotations

import collections
import logging
import time
import traceback
from typing import Any

from omni.kernel.graph import Graph, StageSpec
from omni.kernel.registry import REGISTRY
from omni.kernel.stage import Emit, Stage, StageContext

log = logging.getLogger("omni.driver")

TOMBSTONES = 4096  # finished/cancelled rids remembered so late messages are dropped


class StageDriver:
    def __init__(self, graph: Graph, spec: StageSpec, replica: int, run_dir: str, n_inputs: int) -> None:
        self.graph = graph
        self.spec = spec
        self.replica = replica
        self.run_dir = run_dir
        self.n_inputs = n_inputs
        self.stage: Stage | None = None
        self._inbox: collections.deque[tuple] = collections.deque()
        self._cancels: collections.deque[str] = collections.deque()
        self._ends: dict[str, set[str]] = {}
        self._expected: dict[str, int] = {}  # rid -> inputs it will end here (fewer when it skips stages)
        self._live: set[str] = set()
        self._dead: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._seq: dict[str, int] = {}
        self._has_work = False
        self.last_stats: dict[str, Any] = {}
        self.fence: Any = None  # set by the actor when a channel needs one before credits (cuda_ipc)
        self.completed = 0
        self.aborted = 0
        self.failed = 0
        self.steps = 0
        self.step_seconds = 0.0  # wall time inside stage.step(): where a pipeline's time goes

    # ---- compute thread -----------------------------------------------------------------

    def setup(self) -> None:
        cls = REGISTRY.stage_class(self.spec.kind)
        ctx = StageContext(
            name=self.spec.name,
            replica=self.replica,
            args={**self.spec.args, "max_batch": self.spec.max_batch},
            device=self.spec.device_of(self.replica),
            run_dir=self.run_dir,
            in_ports=[e.dst_port for e in self.graph.incoming(self.spec.name)],
            out_ports=sorted({e.port for e in self.graph.outgoing(self.spec.name)}),
        )
        self.stage = cls(ctx)
        self.stage.setup()
        self.last_stats = self._stats()

    def teardown(self) -> None:
        if self.stage is not None:
            self.stage.teardown()

    def run_once(self) -> tuple[list[Emit], list[tuple[str, str, list[int]]]]:
        assert self.stage is not None
        emits: list[Emit] = []
        credits: list[tuple[str, str, list[int]]] = []
        while self._cancels:
            self._abort(self._cancels.popleft(), emits)
        while self._inbox:
            item = self._inbox[0]
            # Past max_queue the stage must first work off what it holds; a stage that holds
            # inputs yet has no work (it waits for more) is fed anyway, or it would deadlock.
            if (item[0] == "chunk" and item[1] in self._live and self.stage.backlog() >= self.spec.max_queue
                    and self.stage.has_work()):
                break
            self._inbox.popleft()
            self._apply(item, emits, credits)
        if self.stage.has_work():
            t0 = time.perf_counter()
            try:
                emits.extend(self.stage.step())
            except Exception as exc:
                log.exception("stage %s step failed", self.spec.name)
                for rid in list(self._live):
                    emits.append(Emit(rid, error=f"{type(exc).__name__} in stage {self.spec.name}: {exc}"))
                    self._abort(rid, [])
            self.steps += 1
            self.step_seconds += time.perf_counter() - t0
        for emit in emits:
            if (emit.finish or emit.error is not None) and emit.rid in self._live:
                self._retire(emit.rid)
                if emit.error is not None:
                    self.failed += 1
                else:
                    self.completed += 1
        if credits and self.fence is not None:
            self.fence()  # GPU reads of the views must finish before their slots go back
        self._has_work = self.stage.has_work()
        self.last_stats = self._stats()
        return emits, credits

    def _apply(self, item: tuple, emits: list[Emit], credits: list) -> None:
        op, rid = item[0], item[1]
        if op == "chunk":
            credits.append(item[4])
        if rid in self._dead:
            return
        try:
            if op == "open":
                self._live.add(rid)
                self._ends[rid] = set()
                self._expected[rid] = item[3] if item[3] is not None else self.n_inputs
                self.stage.open(rid, item[2])
            elif op == "chunk" and rid in self._live:
                self.stage.feed(rid, item[2], item[3])
            elif op == "end" and rid in self._live:
                self._ends[rid].add(item[2])
                if len(self._ends[rid]) >= self._expected[rid]:
                    self.stage.close_input(rid)
        except Exception as exc:
            kind = getattr(exc, "kind", "stage_failed")
            log.warning("stage %s rejected request %s: %s", self.spec.name, rid, exc)
            log.debug("%s", traceback.format_exc())
            emits.append(Emit(rid, error=f"{type(exc).__name__}: {exc}", error_kind=kind))
            self._abort(rid, [])

    def _abort(self, rid: str, emits: list[Emit]) -> None:
        if rid in self._live:
            try:
                self.stage.abort(rid)
            except Exception:
                log.exception("stage %s abort(%s) failed", self.spec.name, rid)
            self.aborted += 1
            self._retire(rid)
        self._bury(rid)

    def _retire(self, rid: str) -> None:
        self._live.discard(rid)
        self._ends.pop(rid, None)
        self._expected.pop(rid, None)
        self._seq.pop(rid, None)
        self._bury(rid)

    def _bury(self, rid: str) -> None:
        self._dead[rid] = None
        while len(self._dead) > TOMBSTONES:
            self._dead.popitem(last=False)

    def _stats(self) -> dict[str, Any]:
        try:
            stats = dict(self.stage.stats()) if self.stage else {}
        except Exception as exc:
            stats = {"stats_error": str(exc)}
        stats["backlog"] = self.stage.backlog() if self.stage else 0
        return stats

    # ---- loop thread ------------------------------------------------------------------------

    def post_open(self, rid: str, params: dict[str, Any], inputs: int | None = None) -> None:
        """`inputs`: how many inbound edges this request ends here (default: every one)."""
        self._inbox.append(("open", rid, params, inputs))

    def post_chunk(self, rid: str, port: str, data: dict[str, Any], credit: tuple) -> None:
        self._inbox.append(("chunk", rid, port, data, credit))

    def post_end(self, rid: str, edge: str) -> None:
        self._inbox.append(("end", rid, edge))

    def post_cancel(self, rid: str) -> None:
        self._cancels.append(rid)

    def is_dead(self, rid: str) -> bool:
        return rid in self._dead

    def next_seq(self, rid: str) -> int:
        seq = self._seq.get(rid, 0)
        self._seq[rid] = seq + 1
        return seq

    def wants_step(self) -> bool:
        # A stage past max_queue has work (else the driver feeds it), so queued inputs always
        # mean a step is due: either it feeds them or it works off the backlog first.
        return bool(self._cancels or self._has_work or self._inbox)

    def counters(self) -> dict[str, Any]:
        return {
            "in_flight": len(self._live),
            "queued_messages": len(self._inbox),
            "completed": self.completed,
            "aborted": self.aborted,
            "failed": self.failed,
            "steps": self.steps,
            "step_seconds": round(self.step_seconds, 6),
        }
