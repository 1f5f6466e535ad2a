"""The replica chooser (omni/cluster/balancer.py) on its own: least-loaded, ties, a request's load freed
stage by stage, session affinity over load, a replica down or removed, no replica up, the bounded
session table."""

from __future__ import annotations

import pytest

from omni.cluster.balancer import SESSION, Balancer
from omni.kernel.errors import StageDown
from omni.kernel.graph import OUT, EdgeSpec, Graph, StageSpec


def graph(thinker: int = 2, talker: int = 2) -> Graph:
    return Graph("g", [
        StageSpec("front", "x:Y"),
        StageSpec("thinker", "x:Y", replicas=thinker),
        StageSpec("talker", "x:Y", replicas=talker),
    ], [EdgeSpec("front", "a", "thinker"), EdgeSpec("thinker", "b", "talker"), EdgeSpec("talker", "c", OUT)])


STAGES = ["front", "thinker", "talker"]


class Up:
    """The supervisor's view: every replica up but those named down."""

    def __init__(self) -> None:
        self.down: set[str] = set()

    def __call__(self, name: str) -> bool:
        return name not in self.down


def balancer(max_sessions: int = 4096, **replicas: int) -> tuple[Balancer, Up]:
    up = Up()
    return Balancer(graph(**replicas), up, max_sessions), up


def test_least_loaded_with_ties_to_the_lowest_index():
    b, _ = balancer()
    assert [b.place(f"r{i}", STAGES)["thinker"] for i in range(4)] == [0, 1, 0, 1]
    assert b.load("thinker.0") == b.load("thinker.1") == 2
    b.done("r1")
    b.done("r3")  # thinker.1 now idle, thinker.0 holds two
    assert [b.place(f"s{i}", STAGES)["thinker"] for i in range(3)] == [1, 1, 0]  # 2:0, 2:1, then the tie 2:2


def test_the_choice_is_stable_and_one_replica_stages_are_left_out():
    first, second = balancer()[0], balancer()[0]
    picks = [first.place(f"r{i}", STAGES) for i in range(5)]
    assert picks == [second.place(f"r{i}", STAGES) for i in range(5)]
    assert all(set(p) == {"thinker", "talker"} for p in picks)  # "front" has one replica: always 0, not sent
    assert first.replica("r2", "front") == "front.0" and first.replica("r2", "thinker") == f"thinker.{picks[2]['thinker']}"


def test_a_stage_the_request_has_left_no_longer_counts_as_its_load():
    b, _ = balancer()
    assert b.place("a", STAGES) == {"thinker": 0, "talker": 0}
    b.left("a", "thinker")  # its thinker is done, its talker still speaks
    assert b.load("thinker.0") == 0 and b.load("talker.0") == 1
    assert b.place("b", STAGES) == {"thinker": 0, "talker": 1}
    b.left("a", "thinker")  # twice, or after the end: nothing more to free
    b.done("a")
    b.done("a")
    assert b.load("thinker.0") == 1 and b.load("talker.0") == 0 and b.load("talker.1") == 1


def test_a_session_stays_on_its_replica_however_loaded():
    b, up = balancer()
    first = b.place("turn1", STAGES, {SESSION: "s"})
    assert first == {"thinker": 0, "talker": 0}
    up.down = {"thinker.1", "talker.1"}
    for i in range(5):  # its replicas busy, the others idle
        b.place(f"busy{i}", ["thinker", "talker"])
    up.down = set()
    b.done("turn1")
    assert b.load("thinker.0") == b.load("talker.0") == 5 and b.load("thinker.1") == b.load("talker.1") == 0
    assert b.place("turn2", STAGES, {SESSION: "s"}) == first
    assert b.place("other", STAGES, {SESSION: "t"}) != first  # another session: least-loaded
    assert b.session_of("s") == first


def test_sessions_spread_over_idle_replicas():
    """Between turns every replica is idle: the tie goes to the replica fewer sessions are bound to, so
    sessions opened one after another do not all pile onto replica 0."""
    b, _ = balancer()
    for i in range(4):
        b.place(f"t{i}", STAGES, {SESSION: f"s{i}"})
        b.done(f"t{i}")
    assert [b.session_of(f"s{i}")["thinker"] for i in range(4)] == [0, 1, 0, 1]
    assert b.sessions("thinker.0") == b.sessions("thinker.1") == 2


def test_a_down_replica_is_never_chosen_and_a_session_moves_for_good():
    b, up = balancer()
    assert b.place("t1", STAGES, {SESSION: "s"})["thinker"] == 0
    b.done("t1")
    up.down.add("thinker.0")  # restarting
    for i in range(3):
        assert b.place(f"x{i}", ["thinker"])["thinker"] == 1  # however loaded thinker.1 gets
    assert b.place("t2", STAGES, {SESSION: "s"})["thinker"] == 1
    up.down.clear()  # back, idle: the session stays where it went (its cache is there now)
    assert b.place("t3", STAGES, {SESSION: "s"})["thinker"] == 1
    assert b.sessions("thinker.0") == 0 and b.sessions("thinker.1") == 1


def test_a_replica_removed_from_the_graph_sends_its_session_elsewhere():
    b, _ = balancer(thinker=3)
    b.place("a", STAGES)
    b.place("b", STAGES)
    assert b.place("t1", STAGES, {SESSION: "s"})["thinker"] == 2
    b.graph.stage("thinker").replicas = 2
    assert b.place("t2", STAGES, {SESSION: "s"})["thinker"] in (0, 1)


def test_no_replica_up_is_stage_down_and_records_nothing():
    b, up = balancer()
    up.down |= {"talker.0", "talker.1"}
    with pytest.raises(StageDown, match="talker.0, talker.1"):
        b.place("r", STAGES, {SESSION: "s"})
    assert b.load("thinker.0") == b.load("thinker.1") == 0 and b.session_of("s") == {}
    assert b.place("text-only", ["front", "thinker"])  # a request that skips the talker is served
    up.down = {"front.0"}
    with pytest.raises(StageDown, match="front.0"):
        b.place("r2", STAGES)


def test_the_session_table_is_bounded_least_recently_used_first():
    b, _ = balancer(max_sessions=3)
    for s in ("a", "b", "c"):
        b.place(s, STAGES, {SESSION: s})
        b.done(s)
    b.place("a2", STAGES, {SESSION: "a"})  # a is used again: b is now the oldest
    b.place("d", STAGES, {SESSION: "d"})
    assert b.session_of("b") == {} and all(b.session_of(s) for s in ("a", "c", "d"))
    assert len(b._sessions) == 3
    assert sum(b.sessions(f"thinker.{r}") for r in (0, 1)) == 3  # the forgotten one is unbound too
    for i in range(100):
        b.place(f"n{i}", STAGES, {SESSION: f"n{i}"})
        b.done(f"n{i}")
    assert len(b._sessions) == 3 and sum(b.sessions(f"talker.{r}") for r in (0, 1)) == 3
