"""The codec stage of a Qwen3-TTS graph: the 12 Hz decoder as a streaming vocoder stage.

Everything streaming and batched is the shared `VocoderStage` (first chunk tunable, later chunks
larger, requests with the same next chunk decoded in one forward). What is Qwen3-TTS's own is the
in-context (cloned voice) start: the talker first sends the voice's reference codes, which the
reference decodes in front of the new codes and then cuts away. Every layer is causal and T frames
are exactly T * 1920 samples, so decoding the reference codes into the stream's state and dropping
their samples is the same audio. That state depends on the reference codes only, so it is kept
(LRU) per voice: after a voice's first use its requests start as a named voice's do.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from omni.kernel.errors import InvalidRequest
from omni.models.qwen3_tts.stages.args import TTSCodecArgs
from omni.stages.vocoder import VocoderStage, chunk_schedule

log = logging.getLogger("omni.qwen3_tts.codec")
TOKENIZER_DIR = "speech_tokenizer"
WARM_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # batch sizes a chunk shape is warmed at
WARM_FRAMES = 96  # frames per warm-up stream: past the decoder's left-context lengths


class CodecStage(VocoderStage):
    """args: `TTSCodecArgs` (stages/args.py)."""

    Args = TTSCodecArgs

    def __init__(self, ctx, codec=None) -> None:
        super().__init__(ctx, codec)
        self.voice_states: OrderedDict[str, Any] = OrderedDict()
        self.max_voice_states = ctx.args.voice_states
        self.voice_state_hits = 0

    def build_codec(self):
        import torch

        from omni.models.qwen3_tts.modules.speech_tokenizer_decoder import SpeechTokenizerDecoder

        dtype = self.ctx.args.dtype
        return SpeechTokenizerDecoder.from_dir(Path(self.ctx.args.model_dir) / TOKENIZER_DIR,
                                               dtype=getattr(torch, dtype) if dtype else None,
                                               device=self.ctx.device, seed=self.ctx.args.seed)

    def setup(self) -> None:
        super().setup()
        if self.on_gpu:  # the kernels' first use is paid here, not by a request
            t0 = time.monotonic()
            n = self.warm_up()
            log.info("codec: %d warm-up chunks in %.1f s", n, time.monotonic() - t0)

    def warm_up(self) -> int:
        """Fresh streams at each batch size up to max_batch through a request's chunk schedule
        (first chunk, the growing ones, then full chunks while the left context fills): every
        chunk shape a request meets, batched or alone, runs once before the first request."""
        sizes = sorted({min(b, self.max_batch) for b in WARM_BATCHES})
        schedule = chunk_schedule(WARM_FRAMES, self.first_chunk, self.chunk, self.grow)
        for b in sizes:
            streams = [self.codec.new_stream() for _ in range(b)]
            for frames in schedule:
                codes = np.zeros((b, frames, self.codec.num_groups), dtype=np.int64)
                self.codec.decode_frames(codes, streams).cpu()
        return len(sizes) * len(schedule)

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        if "ref_codes" not in data:
            return super().feed(rid, port, data)
        req = self.requests[rid]
        if req.decoded_frames or req.pending_frames or req.stream.frames:
            raise InvalidRequest("reference codes must come before any codes")
        ref = self._host_block(data["ref_codes"])
        if len(ref):
            req.stream = self._stream_after(ref)

    def _stream_after(self, ref: np.ndarray):
        """A stream whose left context is `ref` decoded (its samples dropped), from the LRU when seen."""
        key = hashlib.sha1(np.ascontiguousarray(ref).tobytes()).hexdigest() + f":{ref.shape}"
        state = self.voice_states.get(key)
        if state is None:
            state = self.codec.new_stream()
            self.codec.decode_frames(ref[None], [state])
            state = self.codec.snapshot(state)  # detached: requests fork it, none advances it
            state.samples = 0  # the reference part is not this request's audio
            self.voice_states[key] = state
            while len(self.voice_states) > self.max_voice_states:
                self.voice_states.popitem(last=False)
        else:
            self.voice_states.move_to_end(key)
            self.voice_state_hits += 1
        return state.fork()

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "voice_states": len(self.voice_states), "voice_state_hits": self.voice_state_hits}

