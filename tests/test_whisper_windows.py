"""Pure helpers of the Whisper family: long-audio windows, timed segments, text joining, log-mel."""

from __future__ import annotations

import numpy as np

from omni.models.whisper.config import WhisperConfig
from omni.models.whisper.modules.features import WINDOW_SAMPLES, log_mel, pad_window
from omni.models.whisper.stages.transcript import WhisperText, join_texts
from omni.models.whisper.stages.windows import split_windows

RATE = 16000


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)


def test_short_audio_is_one_window():
    [w] = split_windows(tone(12.0))
    assert (w.start, w.end, w.offset_s) == (0, 12 * RATE, 0.0)


def test_long_audio_is_cut_in_its_quiet_gaps():
    gap = np.zeros(RATE, np.float32)
    pcm = np.concatenate([tone(25.0), gap, tone(25.0), gap, tone(10.0)])  # 62 s, quiet at 25-26 s and 51-52 s
    windows = split_windows(pcm)
    assert [w.index for w in windows] == [0, 1, 2]
    assert windows[0].start == 0 and windows[-1].end == len(pcm)
    assert all(a.end == b.start for a, b in zip(windows, windows[1:]))
    assert all(w.end - w.start <= WINDOW_SAMPLES for w in windows)
    assert 25 * RATE <= windows[0].end <= 26 * RATE and 51 * RATE <= windows[1].end <= 52 * RATE


def test_audio_without_gaps_still_fits_windows():
    windows = split_windows(tone(95.0))
    assert sum(w.end - w.start for w in windows) == 95 * RATE
    assert all(w.end - w.start <= WINDOW_SAMPLES for w in windows)


def _text(tmp_path) -> WhisperText:
    from test_whisper_support import tiny_random_checkpoint

    model_dir = tiny_random_checkpoint(tmp_path / "m")
    return WhisperText(model_dir, WhisperConfig.from_dir(model_dir))


def test_segments_from_timestamp_tokens(tmp_path):
    text = _text(tmp_path)
    tb = text.cfg.timestamp_begin
    a, b = text.tok.encode("hello", add_special_tokens=False).ids, text.tok.encode("world", add_special_tokens=False).ids
    ids = [tb + 0, *a, tb + 50, tb + 60, *b, tb + 1400]  # 0.00-1.00 hello, 1.20-28.00 (clamped) world
    segs = text.segments(ids, offset_s=30.0, duration_s=20.0)
    assert [(s.start, s.end, s.text) for s in segs] == [(30.0, 31.0, "hello"), (31.2, 50.0, "world")]
    open_end = text.segments([tb + 10, *a], offset_s=0.0, duration_s=7.5)  # no closing timestamp
    assert [(s.start, s.end) for s in open_end] == [(0.2, 7.5)]


def test_join_texts_keeps_one_space_between_windows():
    assert join_texts([" Hello there.", " General Kenobi."]) == " Hello there. General Kenobi."
    assert join_texts(["Hello", "there"]) == "Hello there"
    assert join_texts(["", "x"]) == "x"


def test_log_mel_is_batch_independent():
    rng = np.random.default_rng(0)
    clips = [pad_window((0.1 * rng.standard_normal(RATE * s)).astype(np.float32)) for s in (3, 7)]
    batch = log_mel(np.stack(clips), 80)
    for i, clip in enumerate(clips):
        assert np.allclose(batch[i].numpy(), log_mel(clip, 80).numpy(), atol=1e-6)
