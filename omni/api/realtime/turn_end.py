"""When a spoken turn has ended: the early end-of-turn rule that both `server_vad` and `semantic_vad`
use, and `semantic_vad`'s eagerness table. No transcript: only silero's speech probability and the
energy of the speech it heard.

The rule, per 32 ms window once speech has stopped (silero below `threshold - 0.15`):

* the turn ends after the full wait (`server_vad`'s `silence_duration_ms`, `semantic_vad`'s
  eagerness maximum), whatever the cues say: what OpenAI does;
* it ends early, after only `early_ms`, when the speech is clearly finished: (1) silero's probability
  has stayed below `QUIET_PROB` (well below any threshold) for `early_ms` in a row, a pause that
  hovers in between (a breath, a hesitation) restarts that count; and (2) the speech trailed off:
  the mean energy of its last `TAIL_WINDOWS` windows is at most `TAIL_SHARE` of its loud windows'
  (90th percentile), where a speaker cut off mid-word stays loud to the end.

Speech (a window at `threshold` or above) always cancels both counts, so a pause shorter than
`early_ms` followed by speech never splits a turn.

`semantic_vad`'s eagerness: OpenAI's API reference gives the maximum waits, "`low`, `medium`, and
`high` have max timeouts of 8s, 4s, and 2s respectively" and "`auto` ... is equivalent to
`medium`" (the `eagerness` field of `turn_detection`). The early windows are omni's choice: short
enough for high to answer fast, long enough for low to sit out a clause pause (espeak's comma pause
is ~130 ms below `QUIET_PROB`, a speaker's breath 200-500 ms).
"""

from __future__ import annotations

from collections import deque

import numpy as np

EAGERNESS = {"high": (200, 2000), "medium": (400, 4000), "low": (800, 8000)}  # (early_ms, max_ms)
EAGERNESS["auto"] = EAGERNESS["medium"]
QUIET_PROB = 0.15
SERVER_EARLY_MIN_MS = 200


def server_early_ms(silence_ms: int) -> int:
    """`server_vad`'s early window when the client names none: half its silence, at least 200 ms
    (no longer than the silence itself). OpenAI's default 500 ms silence gives 250 ms."""
    return min(silence_ms, max(SERVER_EARLY_MIN_MS, silence_ms // 2))
TAIL_WINDOWS = 3
TAIL_SHARE = 0.5


class TurnEnd:
    """One session's end-of-turn judge. `heard` every speech window, `unsure` every window between
    speech and silence, `ended` every silent window: True when the turn is over."""

    def __init__(self, window: int, early_samples: int, full_samples: int) -> None:
        self.window = window
        self.early = early_samples
        self.full = full_samples
        self._energy: deque[float] = deque(maxlen=1000)  # the last ~30 s of speech windows
        self._quiet = 0  # samples of consecutive windows below QUIET_PROB

    def begin(self) -> None:
        self._energy.clear()
        self._quiet = 0

    def heard(self, rms: float) -> None:
        self._energy.append(rms)
        self._quiet = 0

    def unsure(self) -> None:
        self._quiet = 0

    def ended(self, prob: float, silent: int) -> bool:
        """`silent`: samples since speech stopped, this window included."""
        self._quiet = self._quiet + self.window if prob < QUIET_PROB else 0
        if silent >= self.full:
            return True
        return 0 < self.early <= self._quiet and self.trailed_off()

    def trailed_off(self) -> bool:
        if not self._energy:
            return True
        energy = np.asarray(self._energy)
        tail = float(energy[-TAIL_WINDOWS:].mean())
        return tail <= TAIL_SHARE * float(np.percentile(energy, 90))
