"""Which tokens a diffusion stream solves next: plain Python over counts, no tensors.

A stream's tokens are cut into chunks; each chunk is solved in a window that adds context before and
after it (the window's output outside the chunk is dropped). Chunks and windows start on multiples
of `align` (the model's attention block), so a window's blocks are the whole utterance's blocks. A
window waits until its right context has arrived, or the input ended. Growing chunks (`grow`) are
each as long as the audio already out, up to `chunk` (2, 2, 4, 8, 8, ... blocks): the first audio
comes as early as with short chunks, the stream's buffer stays ahead, and a long answer needs far
fewer windows (each a whole ODE solve) than with short ones. With `first_chunk == 0` the
stream is solved whole, in one window, once its input ended: exactly what a reference that only
decodes whole utterances computes.
"""

from __future__ import annotations

from dataclasses import dataclass

from omni.stages.vocoder import chunk_after


@dataclass(frozen=True)
class Window:
    start: int  # first token of the window (context included)
    chunk_start: int  # the chunk: tokens whose output this window emits
    chunk_end: int
    end: int  # one past the window's last token
    last: bool  # the stream's last chunk

    @property
    def tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Chunking:
    """All in tokens; every value a multiple of `align`."""

    align: int
    first_chunk: int  # 0: the whole utterance in one window
    chunk: int
    left: int
    right: int
    grow: bool = False

    @classmethod
    def in_blocks(cls, align: int, first: int, chunk: int, left: int, right: int, grow: bool = False) -> "Chunking":
        return cls(align, first * align, chunk * align, left * align, right * align, grow)

    def chunk_after(self, done: int) -> int:
        """The chunk's length once `done` tokens went out (the streaming vocoder's rule)."""
        return chunk_after(done, self.first_chunk, self.chunk, self.grow)

    def schedule(self, chunks: int) -> list[int]:
        """The first `chunks` chunk lengths of an unbounded stream."""
        sizes, done = [], 0
        for _ in range(chunks):
            sizes.append(self.chunk_after(done))
            done += sizes[-1]
        return sizes

    @property
    def longest_window(self) -> int:
        """Tokens of the longest window (0: unbounded, the whole utterance)."""
        return self.left + max(self.first_chunk, self.chunk) + self.right if self.first_chunk else 0

    def next_window(self, done: int, received: int, closed: bool) -> Window | None:
        """The window of the chunk after the first `done` tokens, given `received` tokens so far
        (None: wait for more, or nothing is left)."""
        if done >= received:
            return None
        if not self.first_chunk:
            return Window(0, 0, received, received, True) if closed and received else None
        end = done + self.chunk_after(done)
        if not closed and received < end + self.right:
            return None
        end = min(end, received)
        last = closed and end >= received
        return Window(max(0, done - self.left), done, end, min(received, end + self.right), last)
