"""A turn's audio encoded while it is spoken: each time the input buffer holds one more complete
attention window of the audio encoder (ModelInfo `audio_window`), the turn so far goes to the
kernel as an encode request (the family's request.ENCODE: no answer), which leaves those windows in
the audio encoder's cache. At commit the turn's chat request finds them there and only the last,
partial window is encoded. Exactness is the cache's: a window is reused only when its log-mels are
bitwise the final ones (they can change when a louder sound later raises the clip's peak, and
then the window is simply encoded again at commit).

Best effort: one request in flight per session, and a refused or failed one is forgotten.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from omni.api.media import audio_part
from omni.api.realtime.audio_buffer import InputAudio
from omni.api.realtime.vad import VAD_RATE
from omni.cluster.balancer import SESSION

if TYPE_CHECKING:
    from omni.api.state import ServerState

log = logging.getLogger("omni.api")
TASK = "encode"


class AudioPrefetch:
    def __init__(self, state: ServerState, window: dict, session: str = "") -> None:
        self.kernel, self.session = state.kernel, session  # its encodes go where the session's turns go
        self.samples, self.lead = int(window["samples"]), int(window["lead"])
        self.start = -1  # the buffer start the windows below were sent for
        self.windows = 0  # complete windows sent for it
        self.task: asyncio.Task | None = None
        self.sent = 0  # encode requests made (for tests and figures)

    @classmethod
    def of(cls, state: ServerState, hears: bool, session: str = "") -> AudioPrefetch | None:
        window = state.info.audio_window
        return cls(state, window, session) if hears and isinstance(window, dict) else None

    def offer(self, audio: InputAudio) -> None:
        """After an append, while the turn is spoken: send the turn so far if it completes a window
        (one request at a time; the one in flight looks again when it is done)."""
        if audio.start != self.start:
            self.start, self.windows = audio.start, 0
        if self._complete(audio) > self.windows and (self.task is None or self.task.done()):
            self.task = asyncio.create_task(self._encode(audio))

    def _complete(self, audio: InputAudio) -> int:
        return max(0, len(audio) - self.lead) // self.samples if audio.start == self.start else 0

    async def _encode(self, audio: InputAudio) -> None:
        while (complete := self._complete(audio)) > self.windows:
            self.windows = complete
            self.sent += 1
            params = {"task": TASK, "audio": audio_part(audio.peek(), VAD_RATE), "modalities": ["text"],
                      SESSION: self.session}
            try:
                await self.kernel.submit(params).collect()
            except Exception as exc:  # the turn's own request encodes what this did not
                log.debug("realtime audio prefetch skipped: %s: %s", type(exc).__name__, exc)
                return

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
