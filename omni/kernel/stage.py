"""The pure stage interface: no sockets, no processes, testable on its own.

The actor drives a stage from one compute thread, so a stage needs no locks: it is told
about requests (`open`, `feed`, `close_input`, `abort`) and is stepped (`step`), which
returns what to send. Arrays in `Emit.data` travel through the edge's payload channel,
every other value rides in the message (msgpack types only).

A step's chunks of many requests on one port can go as one `Emit(rows=[rid...])`: row i of each
array in `data` is request rows[i]'s chunk (its other values belong to every row). The actor
sends one message per edge and consumer replica; each consumer feeds every row as its own chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Emit:
    """One output of a step: a chunk on `port`, and/or the end of the request here."""

    rid: str
    port: str = "out"
    data: dict[str, Any] | None = None
    finish: bool = False  # the request is complete at this stage: end every outgoing edge
    error: str | None = None  # fail the request with this message
    error_kind: str = "stage_failed"
    end_meta: dict[str, Any] | None = None  # with finish: rides on every End (e.g. usage, finish_reason)
    rows: list[str] | None = None  # a batched chunk (see above): `rid`, `finish` and `error` unused


@dataclass
class StageContext:
    """What a stage knows of its place in the graph."""

    name: str
    replica: int = 0
    args: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    in_ports: list[str] = field(default_factory=list)  # destination ports of inbound edges
    out_ports: list[str] = field(default_factory=list)


class Stage:
    """Base class of every stage kind. Subclasses override what they need."""

    def __init__(self, ctx: StageContext) -> None:
        self.ctx = ctx

    def setup(self) -> None:
        """Load weights, warm up. Runs in the compute thread before the actor reports ready."""

    def open(self, rid: str, params: dict[str, Any]) -> None:
        """A request arrived; `params` are the request's parameters."""

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        """One chunk arrived on input `port`. Arrays are only valid during the call: copy."""

    def close_input(self, rid: str) -> None:
        """Every inbound edge of the request has ended."""

    def abort(self, rid: str) -> None:
        """Free everything held for the request now."""

    def step(self) -> list[Emit]:
        """Do one unit of work; return what to send."""
        return []

    def has_work(self) -> bool:
        """True when `step` would make progress."""
        return False

    def backlog(self) -> int:
        """Inputs taken but not yet processed; the actor stops feeding past `max_queue`."""
        return 0

    def stats(self) -> dict[str, Any]:
        return {}

    def teardown(self) -> None:
        """Release resources; called once at shutdown."""
