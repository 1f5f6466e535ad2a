"""The compute side of an actor in-process: typed inbox items in, emits and taken chunks out."""

from __future__ import annotations

from omni.kernel.driver import Chunk, End, Open, StageDriver
from omni.models.demo.stages import demo_graph


def _encoder() -> StageDriver:
    driver = StageDriver(demo_graph(), "encoder", 0)
    driver.setup()
    return driver


def test_a_request_opens_ends_and_finishes():
    driver = _encoder()
    driver.post(Open("a", {"prompt": "hi"}, inputs=1))
    assert driver.wants_step()
    driver.post(End("a", -1))
    emits, taken = driver.run_once()
    assert [e.port for e in emits if e.data is not None] == ["embeds"] and emits[-1].finish and not taken
    assert emits[0].data["embeds"].shape[0] == len(b"hi")
    stats = driver.stats()
    assert stats["completed"] == 1 and stats["in_flight"] == 0 and not driver.wants_step()


def test_bad_input_fails_only_its_request_and_late_messages_are_dropped():
    driver = _encoder()
    driver.post(Open("bad", {"prompt": ""}, inputs=1))
    driver.post(Open("good", {"prompt": "ok"}, inputs=1))
    driver.post(End("good", -1))
    emits, _ = driver.run_once()
    errors = [e for e in emits if e.error is not None]
    assert [(e.rid, e.error_kind) for e in errors] == [("bad", "invalid_request")]
    assert any(e.rid == "good" and e.finish for e in emits)
    late = Chunk("bad", "in", {"x": 1}, edge=0, producer="encoder.0", tokens=[7])
    driver.post(late)
    driver.post(End("bad", -1))
    emits, taken = driver.run_once()
    assert driver.is_dead("bad") and not emits and taken == [late]  # its credit still goes back


def test_a_cancel_beats_the_open_it_races():
    driver = _encoder()
    driver.post(Open("c", {"prompt": "hi"}, inputs=1))
    driver.post(End("c", -1))
    driver.post_cancel("c")
    emits, _ = driver.run_once()
    assert not emits and driver.is_dead("c") and driver.stats()["in_flight"] == 0
