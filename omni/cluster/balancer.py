"""Which replica of each stage serves a request: least-loaded, with session affinity.

The kernel asks when a request opens (`Balancer.place`) and tells it what happens after (`left`,
`done`); the choice then rides in the request's RequestOpen (omni/kernel/routing.py), so the request
keeps its replica in every stage for its whole life, on one host or several.

- Load: the requests in flight that still hold state in a replica (a stage's RequestLeft or the
  request's end frees it). The least-loaded replica that is up wins; ties go to the replica fewer
  sessions are bound to (idle sessions come back: binding them all to one replica would queue their
  turns there later), then to the lowest index.
- Only a replica the supervisor has `up` is chosen (one starting, restarting or down is not); a stage
  the request uses with none up is StageDown.
- Session affinity: a request whose params carry `session` (SESSION; the Realtime route sets it to the
  socket's session id for every turn and every audio prefetch) goes to the replica its session used
  before in each stage, while that replica is up: its prefix and encoder caches are there. Otherwise,
  least-loaded again, and the new one is remembered. The table keeps the `max_sessions` most recently
  used sessions (an LRU), not every session ever seen. The key reaches the stages too, unused.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from omni.kernel.errors import StageDown
from omni.kernel.graph import Graph
from omni.kernel.rundir import actor_name

SESSION = "session"  # the request param naming its session
MAX_SESSIONS = 4096


class Balancer:
    """`up(actor name)`: does that replica serve now (the supervisor's state)."""

    def __init__(self, graph: Graph, up: Callable[[str], bool], max_sessions: int = MAX_SESSIONS) -> None:
        self.graph, self.up, self.max_sessions = graph, up, max_sessions
        self._placed: dict[str, dict[str, int]] = {}  # rid -> stage -> replica, while in flight
        self._holding: dict[str, set[str]] = {}  # rid -> the multi-replica stages it still holds state in
        self._load: dict[str, int] = {}  # actor name -> requests holding state in it
        self._sessions: OrderedDict[str, dict[str, int]] = OrderedDict()  # session -> stage -> replica
        self._bound: dict[str, int] = {}  # actor name -> sessions bound to it

    def place(self, rid: str, stages: list[str], params: dict | None = None) -> dict[str, int]:
        """Choose and record `rid`'s replica in each of `stages` that has several (the placement sent in
        its RequestOpen). Raises StageDown, recording nothing, when a stage has no replica up (only the
        stages a request uses matter: a down stage it skips does not)."""
        session = str((params or {}).get(SESSION) or "")
        before = self._sessions.get(session, {}) if session else {}
        placed: dict[str, int] = {}
        down: list[str] = []
        for stage in stages:
            names = [actor_name(stage, r) for r in range(self.graph.stage(stage).replicas)]
            alive = [r for r, name in enumerate(names) if self.up(name)]
            if not alive:
                down.extend(names)
            elif len(names) > 1:
                r = before.get(stage, -1)
                placed[stage] = r if r in alive else min(alive, key=lambda i: (self.load(names[i]),
                                                                               self.sessions(names[i]), i))
        if down:
            raise StageDown(f"stage(s) not serving: {', '.join(down)}")
        self._placed[rid], self._holding[rid] = placed, set(placed)
        for stage, r in placed.items():
            _count(self._load, actor_name(stage, r), 1)
        if session and placed:
            self._bind(session, placed)
        return placed

    def replica(self, rid: str, stage: str) -> str:
        """The actor serving in-flight `rid` in `stage`."""
        return actor_name(stage, self._placed.get(rid, {}).get(stage, 0))

    def left(self, rid: str, stage: str) -> None:
        """`rid` holds nothing in `stage` any more: it no longer loads that replica."""
        if stage in (holding := self._holding.get(rid, set())):
            holding.discard(stage)
            _count(self._load, self.replica(rid, stage), -1)

    def done(self, rid: str) -> None:
        """`rid` ended (finished, failed or cancelled)."""
        for stage in list(self._holding.get(rid, ())):
            self.left(rid, stage)
        self._placed.pop(rid, None)
        self._holding.pop(rid, None)

    def load(self, name: str) -> int:
        return self._load.get(name, 0)

    def sessions(self, name: str) -> int:
        """Sessions bound to replica `name`."""
        return self._bound.get(name, 0)

    def session_of(self, session: str) -> dict[str, int]:
        """Where `session` goes now: stage -> replica (empty: unknown or forgotten)."""
        return dict(self._sessions.get(session, {}))

    def _bind(self, session: str, placed: dict[str, int]) -> None:
        bound = self._sessions.setdefault(session, {})
        self._sessions.move_to_end(session)
        for stage, r in placed.items():
            if bound.get(stage) != r:
                if stage in bound:
                    _count(self._bound, actor_name(stage, bound[stage]), -1)
                bound[stage] = r
                _count(self._bound, actor_name(stage, r), 1)
        while len(self._sessions) > self.max_sessions:
            for stage, r in self._sessions.popitem(last=False)[1].items():
                _count(self._bound, actor_name(stage, r), -1)


def _count(table: dict[str, int], name: str, delta: int) -> None:
    if (n := table.get(name, 0) + delta) > 0:
        table[name] = n
    else:
        table.pop(name, None)
