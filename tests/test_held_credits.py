"""A consumer's credits wait for the GPU reads of the rows they free (omni/kernel/actor.py): a step's
credits go back once its reader mark is done, oldest first, without the host blocking on kernels queued
ahead of the mark (a decode step launched ahead); credits with no GPU read go back at once."""

from __future__ import annotations

from types import SimpleNamespace

from omni.kernel.actor import Actor
from omni.kernel.driver import Chunk


class Mark:
    def __init__(self) -> None:
        self.finished = False

    def done(self) -> bool:
        return self.finished


class Outbox:
    def __init__(self) -> None:
        self.sent: list[tuple[str, list[int]]] = []

    def send(self, to: str, msg) -> None:
        self.sent.append((to, list(msg.tokens)))


def chunk(token: int) -> Chunk:
    return Chunk(rid="r", port="in", data={}, edge=0, producer="thinker.0", tokens=[token])


def test_credits_go_back_when_their_reads_are_done_oldest_first():
    actor = SimpleNamespace(_held=[], outbox=Outbox(), name="talker.0")
    first, second = Mark(), Mark()
    actor._held = [(first, [chunk(1)]), (second, [chunk(2)]), (None, [chunk(3)])]
    Actor._send_credits(actor)
    assert actor.outbox.sent == []  # the oldest read is still queued on the GPU
    second.finished = True
    Actor._send_credits(actor)
    assert actor.outbox.sent == []  # in order: the first holds the rest
    first.finished = True
    Actor._send_credits(actor)
    assert actor.outbox.sent == [("thinker.0", [1]), ("thinker.0", [2]), ("thinker.0", [3])]
    assert actor._held == []


def test_credits_without_a_gpu_read_go_back_at_once():
    actor = SimpleNamespace(_held=[(None, [chunk(7), chunk(8)])], outbox=Outbox(), name="talker.0")
    Actor._send_credits(actor)
    assert actor.outbox.sent == [("thinker.0", [7]), ("thinker.0", [8])]
