"""The early end-of-turn rule (omni/api/realtime/turn_end.py) on real silero-vad and espeak-ng speech,
timed in audio samples: semantic_vad's high eagerness commits sooner after the end of speech than low,
both before their maximum waits; a pause shorter than the early window does not split a sentence; a
speaker cut off mid-word waits the full time; server_vad's default commits early too, and with
`early_silence_ms: 0` waits its whole silence. Plus the settings' parsing and their errors."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf

from omni.api.media import resample

pytest.importorskip("silero_vad")

RATE = 16000


def _say(tmp_path, text: str) -> np.ndarray:
    path = tmp_path / f"{abs(hash(text))}.wav"
    try:
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True, timeout=30)
    except (FileNotFoundError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"espeak-ng is needed: {exc}")
    pcm, rate = sf.read(str(path), dtype="float32")
    pcm = resample(pcm, rate, RATE).astype(np.float32)
    loud = np.flatnonzero(np.abs(pcm) > 1e-3)  # espeak's own silence before and after: trimmed, so that
    return pcm[loud[0]:loud[-1] + 1]  # the pauses below are what the test says they are


def _silence(ms: int) -> np.ndarray:
    return np.zeros(ms * RATE // 1000, np.float32)


@pytest.fixture(scope="module")
def voice(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("turn-end")
    return lambda text: _say(tmp, text)


def _turns(detect, pcm: np.ndarray) -> list:
    """The detector's events over `pcm`, fed 100 ms at a time (what a client's appends bring)."""
    from omni.api.realtime.vad import SpeechDetector

    detector = SpeechDetector(detect.vad)
    try:
        return [e for i in range(0, len(pcm), 1600) for e in detector.feed(pcm[i:i + 1600])]
    finally:
        detector.close()


def _detect(value: dict):
    from omni.api.realtime.config import _turn_detection

    return _turn_detection(value, None, "session.turn_detection")


def _wait_ms(events) -> float:
    """Audio time from the end of speech to the decision that the turn is over."""
    stopped = [e for e in events if e.kind == "stopped"]
    assert [e.kind for e in events] == ["started", "stopped"], events
    return (stopped[0].at - stopped[0].sample) * 1000 / RATE


def test_high_eagerness_commits_sooner_than_low_and_both_before_their_maximum(voice):
    from omni.api.realtime.turn_end import EAGERNESS

    pcm = np.concatenate([_silence(300), voice("Hello there, could you tell me a short story?"), _silence(9000)])
    waits = {e: _wait_ms(_turns(_detect({"type": "semantic_vad", "eagerness": e}), pcm)) for e in EAGERNESS}
    assert waits["high"] < waits["medium"] < waits["low"], waits
    assert waits["auto"] == waits["medium"]
    for eagerness, (early_ms, max_ms) in EAGERNESS.items():
        assert early_ms <= waits[eagerness] < early_ms + 200 < max_ms, (eagerness, waits)


def test_a_pause_shorter_than_the_early_window_does_not_split_the_sentence(voice):
    from omni.api.realtime.turn_end import EAGERNESS

    head, tail = voice("Could you tell me"), voice("a short story about dragons?")
    for eagerness, (early_ms, _) in EAGERNESS.items():
        pause = early_ms * 3 // 4  # of digital silence, longer still than what silero hears as quiet
        pcm = np.concatenate([_silence(300), head, _silence(pause), tail, _silence(9000)])
        events = _turns(_detect({"type": "semantic_vad", "eagerness": eagerness}), pcm)
        assert [e.kind for e in events] == ["started", "stopped"], (eagerness, pause, events)
        assert events[1].sample > (300 * RATE // 1000) + len(head) + pause  # it ended after the second part
    # server_vad's default early window (250 ms) sits out a 180 ms pause too
    pcm = np.concatenate([_silence(300), head, _silence(180), tail, _silence(1000)])
    assert [e.kind for e in _turns(_detect({"type": "server_vad"}), pcm)] == ["started", "stopped"]
    # and a pause longer than the whole wait is two turns (the rule does not merge them)
    pcm = np.concatenate([_silence(300), head, _silence(1500), tail, _silence(1000)])
    assert [e.kind for e in _turns(_detect({"type": "server_vad"}), pcm)] == ["started", "stopped"] * 2


def test_speech_cut_off_mid_word_waits_the_full_time(voice):
    sentence = voice("Hello there, could you tell me a short story?")
    cut = sentence[: int(len(sentence) * 0.55)]
    loud = np.abs(cut[-1600:]).max()
    assert loud > 0.05  # the cut falls inside a word: still loud at its last sample
    pcm = np.concatenate([_silence(300), cut, _silence(3000)])
    wait = _wait_ms(_turns(_detect({"type": "semantic_vad", "eagerness": "high"}), pcm))
    assert 2000 <= wait < 2100, wait  # high's maximum: not trailed off, so not clearly finished


def test_server_vad_commits_early_by_default_and_waits_its_silence_when_told(voice):
    pcm = np.concatenate([_silence(300), voice("Hello there, could you tell me a short story?"), _silence(2000)])
    early = _wait_ms(_turns(_detect({"type": "server_vad", "silence_duration_ms": 800}), pcm))
    full = _wait_ms(_turns(_detect({"type": "server_vad", "silence_duration_ms": 800, "early_silence_ms": 0}), pcm))
    assert 400 <= early < 500 and 800 <= full < 850, (early, full)
    default = _wait_ms(_turns(_detect({"type": "server_vad"}), pcm))
    assert 250 <= default < 350, default  # OpenAI's default 500 ms silence, committed at 250 ms


def test_turn_detection_settings_parse_render_and_refuse(deaf_server_state):
    from omni.api.errors import ApiError
    from omni.api.realtime.config import SessionConfig
    from omni.api.realtime.response import error_event

    state = deaf_server_state
    base = SessionConfig.default(state, "omni-demo")
    semantic = base.updated(state, {"turn_detection": {"type": "semantic_vad", "eagerness": "high",
                                                       "interrupt_response": False}})
    detect = semantic.turn_detection
    assert detect.eagerness == "high" and detect.vad.early_ms == 200 and detect.vad.silence_duration_ms == 2000
    assert not detect.interrupt_response and detect.create_response
    assert detect.render() == {"type": "semantic_vad", "eagerness": "high", "create_response": True,
                               "interrupt_response": False}
    ga = base.updated(state, {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}})
    assert ga.render(beta=False, session_id="s")["audio"]["input"]["turn_detection"]["eagerness"] == "auto"
    back = semantic.updated(state, {"turn_detection": {"type": "server_vad"}})
    assert back.turn_detection.render()["silence_duration_ms"] == 500 and back.turn_detection.eagerness is None
    assert back.turn_detection.vad.early_ms == 250 and not back.turn_detection.interrupt_response
    for bad, param in (({"type": "semantic_vad", "eagerness": "eager"}, "session.turn_detection.eagerness"),
                       ({"type": "semantic_vad", "eagerness": 3}, "session.turn_detection.eagerness"),
                       ({"type": "server_vad", "early_silence_ms": -1}, "session.turn_detection.early_silence_ms"),
                       ({"type": "vad"}, "session.turn_detection.type")):
        with pytest.raises(ApiError) as err:
            base.updated(state, {"turn_detection": bad})
        assert err.value.param == param, (bad, err.value.param)
        event = error_event(err.value, "ev_1")  # what the session sends: OpenAI's error event
        assert event["type"] == "error" and event["error"]["type"] == "invalid_request_error"
        assert event["error"]["event_id"] == "ev_1" and event["error"]["code"] in ("invalid_value",
                                                                                 "unsupported_turn_detection")


@pytest.fixture(scope="module")
def deaf_server_state():
    """What SessionConfig reads of a server to parse turn detection: a model that neither speaks nor
    names a default length (no engine, no voices)."""
    return SimpleNamespace(info=SimpleNamespace(id="omni-demo", speaks=False, default_max_tokens=None))
