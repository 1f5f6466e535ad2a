"""The Piper voice as three stages: sentences -> synthesis -> resampling.

`SentenceStage` normalises the request's text and sends it on sentence by sentence;
`SynthStage` turns one sentence per step into 22.05 kHz audio with the VITS model, so a long
text streams (the first sentence's audio leaves while the next ones are synthesised) and
several requests take turns; `ResampleStage` streams each request's audio through soxr to the
rate the request asks (`params["sample_rate"]`, else the stage's `sample_rate`).
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import Emit, Stage
from omni_piper.text import MAX_SENTENCE_CHARS, normalize, split_sentences

MIN_RATE, MAX_RATE = 8000, 96000


def speech_text(params: dict[str, Any]) -> str:
    if params.get("task") != "speech":
        raise InvalidRequest(f"the Piper voice only speaks text (/v1/audio/speech); task {params.get('task')!r} "
                             "is not served")
    text = params.get("input")
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest("input must be non-empty text")
    return text


class SentenceStage(Stage):
    """Text -> normalised sentences, all sent at once (cheap); port `sentences`."""

    def setup(self) -> None:
        self.max_chars = int(self.ctx.args.get("max_sentence_chars", MAX_SENTENCE_CHARS))
        self.ready: deque[tuple[str, list[str]]] = deque()

    def open(self, rid: str, params: dict[str, Any]) -> None:
        sentences = split_sentences(normalize(speech_text(params)), self.max_chars)
        if not sentences:
            raise InvalidRequest("input has nothing to speak (no words after normalisation)")
        self.ready.append((rid, sentences))

    def abort(self, rid: str) -> None:
        self.ready = deque(item for item in self.ready if item[0] != rid)

    def has_work(self) -> bool:
        return bool(self.ready)

    def backlog(self) -> int:
        return len(self.ready)

    def step(self) -> list[Emit]:
        emits = []
        while self.ready:
            rid, sentences = self.ready.popleft()
            for index, sentence in enumerate(sentences):
                emits.append(Emit(rid, "sentences", {"text": sentence, "index": index, "count": len(sentences)}))
            emits.append(Emit(rid, finish=True))
        return emits


@dataclass
class _Speech:
    length_scale: float
    queue: deque = field(default_factory=deque)  # (index, text)
    closed: bool = False


class SynthStage(Stage):
    """One sentence per step through the VITS model; port `pcm` with the synthesis timestamps."""

    def setup(self) -> None:
        from omni_piper.voice import VoiceFiles, bundled_voice, load_voice

        args = self.ctx.args
        files = (VoiceFiles(Path(args["model_path"]), Path(args["config_path"])) if args.get("model_path")
                 else bundled_voice())
        self.voice = load_voice(files, threads=int(args.get("threads", 1)))
        self.rate = int(self.voice.config.sample_rate)
        self.hop = int(self.voice.config.hop_length)
        self.silence = np.zeros(int(float(args.get("sentence_silence_s", 0.2)) * self.rate), np.float32)
        self.trace_file = args.get("trace_file") or None
        self.speeches: dict[str, _Speech] = {}
        self.turn: deque[str] = deque()  # round robin over requests with queued sentences
        self.sentences = 0
        self.audio_s = 0.0
        self.busy_s = 0.0

    def open(self, rid: str, params: dict[str, Any]) -> None:
        speed = float(params.get("speed") or 1.0)
        if not 0.25 <= speed <= 4.0:
            raise InvalidRequest(f"speed must be within [0.25, 4], got {speed}")
        self.speeches[rid] = _Speech(length_scale=float(self.voice.config.length_scale) / speed)

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        speech = self.speeches[rid]
        speech.queue.append((int(data["index"]), str(data["text"])))
        if rid not in self.turn:
            self.turn.append(rid)

    def close_input(self, rid: str) -> None:
        self.speeches[rid].closed = True

    def abort(self, rid: str) -> None:
        self.speeches.pop(rid, None)
        if rid in self.turn:
            self.turn.remove(rid)

    def has_work(self) -> bool:
        return bool(self.turn) or any(s.closed and not s.queue for s in self.speeches.values())

    def backlog(self) -> int:
        return sum(len(s.queue) for s in self.speeches.values())

    def _synthesize(self, text: str, length_scale: float) -> tuple[np.ndarray, int]:
        from piper import SynthesisConfig

        config = SynthesisConfig(length_scale=length_scale)
        pieces, phonemes = [], 0
        for phoneme_list in self.voice.phonemize(text):  # espeak may cut a sentence further
            if not phoneme_list:
                continue
            ids = self.voice.phonemes_to_ids(phoneme_list)
            phonemes += len(ids)
            audio = np.asarray(self.voice.phoneme_ids_to_audio(ids, config), dtype=np.float32).reshape(-1)
            pieces.append(np.clip(audio, -1.0, 1.0))
        return (np.concatenate(pieces) if pieces else np.zeros(0, np.float32)), phonemes

    def step(self) -> list[Emit]:
        emits = []
        for rid in [r for r, s in self.speeches.items() if s.closed and not s.queue]:
            emits.append(Emit(rid, finish=True))
            self.abort(rid)
        if not self.turn:
            return emits
        rid = self.turn.popleft()
        speech = self.speeches[rid]
        index, text = speech.queue.popleft()
        if speech.queue:
            self.turn.append(rid)
        start = time.time()
        pcm, phonemes = self._synthesize(text, speech.length_scale)
        end = time.time()
        if index > 0:
            pcm = np.concatenate([self.silence, pcm])  # a pause between sentences
        self.sentences += 1
        self.audio_s += len(pcm) / self.rate
        self.busy_s += end - start
        if self.trace_file:
            with open(self.trace_file, "a") as trace:
                trace.write(json.dumps({"rid": rid, "index": index, "start": start, "end": end,
                                        "samples": len(pcm), "phonemes": phonemes}) + "\n")
        emits.append(Emit(rid, "pcm", {"pcm": pcm, "sample_rate": self.rate, "index": index,
                                       "frames": len(pcm) // self.hop, "phonemes": phonemes,
                                       "synth_start": start, "synth_end": end}))
        return emits

    def stats(self) -> dict[str, Any]:
        return {"running": len(self.speeches), "queued_sentences": self.backlog(), "sentences": self.sentences,
                "audio_seconds": round(self.audio_s, 3), "busy_seconds": round(self.busy_s, 3)}


@dataclass
class _Stream:
    out_rate: int
    resampler: Any = None
    in_rate: int = 0
    pending: list = field(default_factory=list)
    closed: bool = False
    frames: int = 0  # VITS decoder frames (hop_length samples each): the output "tokens"
    phonemes: int = 0  # phoneme ids read: the input "tokens"
    samples: int = 0


class ResampleStage(Stage):
    """Streams each request's audio through soxr to its output rate; port `audio`."""

    def setup(self) -> None:
        self.default_rate = int(self.ctx.args.get("sample_rate", 24000))
        self.quality = str(self.ctx.args.get("quality", "HQ"))
        self.streams: dict[str, _Stream] = {}

    def open(self, rid: str, params: dict[str, Any]) -> None:
        rate = params.get("sample_rate") or self.default_rate
        if not isinstance(rate, int) or isinstance(rate, bool) or not MIN_RATE <= rate <= MAX_RATE:
            raise InvalidRequest(f"sample_rate must be an integer in [{MIN_RATE}, {MAX_RATE}], got {rate!r}")
        self.streams[rid] = _Stream(rate)

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        stream = self.streams[rid]
        stream.pending.append((np.array(data["pcm"], dtype=np.float32).reshape(-1), int(data["sample_rate"])))
        stream.frames += int(data.get("frames", 0))
        stream.phonemes += int(data.get("phonemes", 0))

    def close_input(self, rid: str) -> None:
        self.streams[rid].closed = True

    def abort(self, rid: str) -> None:
        self.streams.pop(rid, None)

    def has_work(self) -> bool:
        return any(s.pending or s.closed for s in self.streams.values())

    def backlog(self) -> int:
        return sum(len(s.pending) for s in self.streams.values())

    def _resample(self, stream: _Stream, pcm: np.ndarray, rate: int, last: bool = False) -> np.ndarray:
        if not stream.in_rate:
            stream.in_rate = rate
            if rate != stream.out_rate:
                import soxr

                stream.resampler = soxr.ResampleStream(rate, stream.out_rate, 1, dtype="float32",
                                                       quality=self.quality)
        elif rate != stream.in_rate:
            raise ValueError(f"the input rate changed within a request ({stream.in_rate} -> {rate})")
        return stream.resampler.resample_chunk(pcm, last=last) if stream.resampler is not None else pcm

    def step(self) -> list[Emit]:
        emits = []
        for rid in list(self.streams):
            stream = self.streams[rid]
            pieces = [self._resample(stream, pcm, rate) for pcm, rate in stream.pending]
            stream.pending.clear()
            if stream.closed and stream.in_rate:  # the resampler's tail
                pieces.append(self._resample(stream, np.zeros(0, np.float32), stream.in_rate, last=True))
            out = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
            if len(out):
                stream.samples += len(out)
                emits.append(Emit(rid, "audio", {"pcm": out, "sample_rate": stream.out_rate}))
            if stream.closed:
                usage = {"prompt_tokens": stream.phonemes, "completion_tokens": stream.frames}
                meta = {"usage": usage, "finish_reason": "stop"}
                emits.append(Emit(rid, finish=True, end_meta=meta))
                self.abort(rid)
        return emits
