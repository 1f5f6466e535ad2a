"""Server voice activity detection: silero-vad's JIT model (shipped in its wheel) over 16 kHz audio.

`SpeechDetector` turns a stream of 16 kHz samples into speech started / stopped transitions, the
way OpenAI's `server_vad` reports them: speech starts on the first 32 ms window whose speech
probability reaches `threshold` (reported `prefix_padding_ms` earlier, so the committed turn keeps
its onset), and stops after `silence_duration_ms` of windows below `threshold - 0.15` (silero's own
hysteresis), or after only `early_ms` when the speech clearly finished (turn_end.py's rule). It runs
the model on the calling thread: the session calls it off the event loop. Models are stateful (an
RNN), so each session borrows its own from a small pool.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from dataclasses import dataclass

import numpy as np

from omni.api.realtime.turn_end import TurnEnd

VAD_RATE = 16000
WINDOW = 512  # samples per model call at 16 kHz (32 ms), what silero takes
_HYSTERESIS = 0.15


def _model_path() -> str:
    """The JIT model inside the installed wheel, found without importing silero_vad (whose import sets
    torch's global thread count)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("server VAD needs the silero-vad package (pip install silero-vad)")
    return os.path.join(list(spec.submodule_search_locations)[0], "data", "silero_vad.jit")


class _ModelPool:
    """Loaded models waiting for a session (loading one takes ~0.15 s)."""

    def __init__(self) -> None:
        self._free: list = []
        self._lock = threading.Lock()

    def take(self):
        with self._lock:
            if self._free:
                return self._free.pop()
        import warnings

        import torch

        with warnings.catch_warnings():  # torch 2.13 deprecates TorchScript loading; silero ships TorchScript
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.load(_model_path(), map_location="cpu").eval()

    def give(self, model) -> None:
        model.reset_states()
        with self._lock:
            if len(self._free) < 64:
                self._free.append(model)


POOL = _ModelPool()


@dataclass
class VadSettings:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500  # the full wait after speech
    early_ms: int = 0  # the early end-of-turn rule's confirmation window (0: always the full wait)


@dataclass
class SpeechEvent:
    kind: str  # "started" | "stopped"
    sample: int  # absolute 16 kHz sample index: the (padded) onset, or the end of speech
    at: int = 0  # absolute sample index where the detector decided (the end of the window it ran on)


class SpeechDetector:
    """Feed 16 kHz float32 samples; get the transitions they complete."""

    def __init__(self, settings: VadSettings, start_sample: int = 0) -> None:
        self.settings = settings
        self._model = POOL.take()
        self._pending = np.zeros(0, np.float32)
        self._seen = start_sample  # absolute index of the next sample the model runs on
        self.speaking = False
        self._silence_from: int | None = None
        ms = VAD_RATE // 1000
        self._turn = TurnEnd(WINDOW, settings.early_ms * ms, settings.silence_duration_ms * ms)

    def feed(self, pcm: np.ndarray) -> list[SpeechEvent]:
        import torch

        self._pending = np.concatenate([self._pending, np.asarray(pcm, np.float32)])
        out: list[SpeechEvent] = []
        s = self.settings
        with torch.no_grad():
            while len(self._pending) >= WINDOW:
                window, self._pending = self._pending[:WINDOW], self._pending[WINDOW:]
                prob = float(self._model(torch.from_numpy(np.ascontiguousarray(window)), VAD_RATE))
                rms = float(np.sqrt(np.mean(np.square(window))))
                start = self._seen
                self._seen += WINDOW
                if not self.speaking:
                    if prob >= s.threshold:
                        self.speaking, self._silence_from = True, None
                        self._turn.begin()
                        self._turn.heard(rms)
                        onset = max(0, start - s.prefix_padding_ms * VAD_RATE // 1000)
                        out.append(SpeechEvent("started", onset, self._seen))
                elif prob < s.threshold - _HYSTERESIS:
                    if self._silence_from is None:
                        self._silence_from = start
                    if self._turn.ended(prob, self._seen - self._silence_from):
                        self.speaking = False
                        out.append(SpeechEvent("stopped", self._silence_from, self._seen))
                        self._silence_from = None
                elif prob >= s.threshold or self._silence_from is None:
                    self._silence_from = None
                    self._turn.heard(rms)
                else:
                    self._turn.unsure()  # between speech and silence: the pause is not clearly quiet
        return out

    def reset(self) -> None:
        """Forget speech in progress (the buffer was cleared or committed by the client)."""
        self.speaking, self._silence_from = False, None

    def close(self) -> None:
        if self._model is not None:
            POOL.give(self._model)
            self._model = None
