"""The demo family's stages and graph: encoder -> batched toy generator -> chunked toy vocoder.

It is the kernel's own test bed (and `omnid serve`'s default until a real model is given):
small stages with the compute shapes of an omni model, no weights. The generator works in
integer arithmetic so a batched step gives bit-identical results to an unbatched one, in
any process. Its "speech" is tones, its "text" letters: noise, and it says so. Its kinds declare
no args class: they take free-form dict args (as a plugin kind registered without `args=` does),
which the kernel's tests set freely.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni.kernel.errors import InvalidRequest
from omni.kernel.graph import OUT, EdgeSpec, Graph, StageSpec
from omni.kernel.stage import Emit, Stage
import omni.models.registry  # noqa: F401  (registers the demo's kinds, the one way, in the kernel's table)
from omni.stages.sampling import request_sampling

DIM = 16
VOCAB = "abcdefghijklmnopqrstuvwxyz .,!?"
MODULUS = 9973
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 480  # 20 ms of audio per generated token
MAX_CONTEXT = 1 << 16  # prompt tokens (bytes) the toy encoder takes
DEFAULT_MAX_TOKENS = 16  # a request that sets no max_tokens gets this many


def _prompt_of(params: dict[str, Any]) -> str:
    if "prompt" in params:
        prompt = params["prompt"]
    elif params.get("task") == "speech":
        prompt = params.get("input", "")
    else:
        parts = []
        for message in params.get("messages", []):
            content = message.get("content", "")
            if isinstance(content, str):
                parts.append(content)
            else:
                parts.extend(c.get("text", "") for c in content if c.get("type") == "text")
        prompt = "\n".join(parts)
    if not isinstance(prompt, str) or not prompt:
        raise InvalidRequest("the demo model needs a non-empty text prompt")
    return prompt


class ToyEncoder(Stage):
    """Bytes of the prompt -> integer embeddings [n, DIM] (one forward per request batch)."""

    def setup(self) -> None:
        rng = np.random.default_rng(self.ctx.args.get("seed", 0))
        self.table = rng.integers(0, MODULUS, size=(256, DIM), dtype=np.int64)
        self.pending: dict[str, dict[str, Any]] = {}
        self.ready: list[str] = []

    def open(self, rid: str, params: dict[str, Any]) -> None:
        prompt = _prompt_of(params)
        if len(prompt.encode()) > MAX_CONTEXT:  # one token per byte: refused before any work
            raise InvalidRequest(f"the prompt is {len(prompt.encode())} tokens; the demo's context is {MAX_CONTEXT}")
        self.pending[rid] = params

    def close_input(self, rid: str) -> None:
        self.ready.append(rid)

    def abort(self, rid: str) -> None:
        self.pending.pop(rid, None)
        self.ready = [r for r in self.ready if r != rid]

    def has_work(self) -> bool:
        return bool(self.ready)

    def backlog(self) -> int:
        return len(self.ready)

    def step(self) -> list[Emit]:
        emits = []
        for rid in self.ready[: self.ctx.args.get("max_batch", 32)]:
            prompt = _prompt_of(self.pending.pop(rid))
            ids = np.frombuffer(prompt.encode(), dtype=np.uint8)
            emits.append(Emit(rid, "embeds", {"embeds": self.table[ids], "prompt_tokens": int(ids.size)}, finish=True))
        self.ready = self.ready[len(emits):]
        return emits

    def stats(self) -> dict[str, Any]:
        return {"waiting": len(self.ready), "open": len(self.pending)}


@dataclass
class _Sequence:
    max_tokens: int
    state: np.ndarray | None = None
    generated: int = 0
    prompt_tokens: int = 0
    inputs_done: bool = False
    text: list[str] = field(default_factory=list)


class ToyGenerator(Stage):
    """An autoregressive toy: one batched integer matmul per step for every running sequence."""

    def setup(self) -> None:
        rng = np.random.default_rng(self.ctx.args.get("seed", 1))
        self.weight = rng.integers(0, MODULUS, size=(DIM, DIM), dtype=np.int64)
        self.bias = rng.integers(0, MODULUS, size=(DIM,), dtype=np.int64)
        self.step_delay_s = float(self.ctx.args.get("step_delay_s", 0.0))
        self.seqs: dict[str, _Sequence] = {}
        self.steps = 0

    def open(self, rid: str, params: dict[str, Any]) -> None:
        given = request_sampling(params, self.ctx.name)
        max_tokens = int(given.max_tokens if given and given.max_tokens else params.get("max_tokens", DEFAULT_MAX_TOKENS))
        if not 1 <= max_tokens <= 100_000:
            raise InvalidRequest(f"max_tokens must be in [1, 100000], got {max_tokens}")
        self.seqs[rid] = _Sequence(max_tokens)

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        seq = self.seqs[rid]
        seq.state = np.asarray(data["embeds"], dtype=np.int64).sum(axis=0) % MODULUS
        seq.prompt_tokens = int(data.get("prompt_tokens", 0))

    def close_input(self, rid: str) -> None:
        self.seqs[rid].inputs_done = True

    def abort(self, rid: str) -> None:
        self.seqs.pop(rid, None)

    def _running(self) -> list[str]:
        return [rid for rid, s in self.seqs.items() if s.state is not None and s.inputs_done]

    def has_work(self) -> bool:
        return bool(self._running())

    def backlog(self) -> int:
        return sum(1 for s in self.seqs.values() if s.generated == 0)

    def step(self) -> list[Emit]:
        rids = self._running()[: self.ctx.args.get("max_batch", 32)]
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        states = np.stack([self.seqs[r].state for r in rids])
        states = (states @ self.weight + self.bias) % MODULUS  # the batched step
        self.steps += 1
        emits = []
        for rid, state in zip(rids, states):
            seq = self.seqs[rid]
            seq.state = state
            seq.generated += 1
            token = int(state.sum() % len(VOCAB))
            emits.append(Emit(rid, "text", {"text": VOCAB[token], "token_ids": [token]}))
            emits.append(Emit(rid, "frames", {"frames": (state[None, :8] % 64).astype(np.int64)}))
            if seq.generated >= seq.max_tokens:
                usage = {"prompt_tokens": seq.prompt_tokens, "completion_tokens": seq.generated}
                emits.append(Emit(rid, finish=True, end_meta={"usage": usage, "finish_reason": "length"}))
                del self.seqs[rid]
        return emits

    def stats(self) -> dict[str, Any]:
        running = self._running()
        return {"running": len(running), "waiting": len(self.seqs) - len(running), "steps": self.steps,
                "tokens": sum(s.generated for s in self.seqs.values())}


class ToyVocoder(Stage):
    """Frames -> tones, decoded in chunks (first chunk smaller for a fast first audio)."""

    def setup(self) -> None:
        self.first_chunk = int(self.ctx.args.get("first_chunk_frames", 2))
        self.chunk = int(self.ctx.args.get("chunk_frames", 8))
        self.step_delay_s = float(self.ctx.args.get("step_delay_s", 0.0))
        self.buffers: dict[str, list[np.ndarray]] = {}
        self.emitted: dict[str, int] = {}
        self.closed: set[str] = set()
        self.decoded_frames = 0

    def open(self, rid: str, params: dict[str, Any]) -> None:
        self.buffers[rid] = []
        self.emitted[rid] = 0

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        self.buffers[rid].extend(np.array(data["frames"], dtype=np.int64))

    def close_input(self, rid: str) -> None:
        self.closed.add(rid)

    def abort(self, rid: str) -> None:
        self.buffers.pop(rid, None)
        self.emitted.pop(rid, None)
        self.closed.discard(rid)

    def _due(self, rid: str) -> int:
        need = self.first_chunk if self.emitted[rid] == 0 else self.chunk
        have = len(self.buffers[rid])
        return have if rid in self.closed else (need if have >= need else 0)

    def has_work(self) -> bool:
        return any(self._due(rid) or rid in self.closed for rid in self.buffers)

    def backlog(self) -> int:
        return sum(len(b) for b in self.buffers.values())

    def step(self) -> list[Emit]:
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        emits = []
        for rid in list(self.buffers):
            n = self._due(rid)
            if n:
                frames = np.stack(self.buffers[rid][:n])
                del self.buffers[rid][:n]
                emits.append(Emit(rid, "audio", {"pcm": synthesize(frames, self.emitted[rid]), "sample_rate": SAMPLE_RATE}))
                self.emitted[rid] += n
                self.decoded_frames += n
            if rid in self.closed and not self.buffers[rid]:
                emits.append(Emit(rid, finish=True))
                self.abort(rid)
        return emits

    def stats(self) -> dict[str, Any]:
        return {"running": len(self.buffers), "buffered_frames": self.backlog(), "decoded_frames": self.decoded_frames}


def synthesize(frames: np.ndarray, first_index: int) -> np.ndarray:
    """One 20 ms tone per frame, pitch from the frame's codes; continuous phase per frame index."""
    t = np.arange(SAMPLES_PER_FRAME, dtype=np.float64) / SAMPLE_RATE
    out = []
    for i, frame in enumerate(frames):
        freq = 110.0 + 10.0 * float(frame.sum() % 64)
        out.append(0.2 * np.sin(2 * np.pi * freq * (t + (first_index + i) * SAMPLES_PER_FRAME / SAMPLE_RATE)))
    return np.concatenate(out).astype(np.float32)


def demo_graph(**stage_args: dict[str, Any]) -> Graph:
    """encoder -> generator -> vocoder; text from the generator, audio from the vocoder."""
    return Graph(
        name="demo",
        stages=[
            StageSpec("encoder", "demo.encoder", args=dict(stage_args.get("encoder", {}))),
            StageSpec("generator", "demo.generator", args=dict(stage_args.get("generator", {}))),
            StageSpec("vocoder", "demo.vocoder", args=dict(stage_args.get("vocoder", {})), capability="audio_output"),
        ],
        edges=[
            EdgeSpec("encoder", "embeds", "generator"),
            EdgeSpec("generator", "text", OUT),
            EdgeSpec("generator", "frames", "vocoder"),
            EdgeSpec("vocoder", "audio", OUT),
        ],
        needs="omni.models.demo.stages:needs",
        media=["messages", "audio"],  # the encoder (the entry) reads them; the generator and vocoder never
    )


def needs(params: dict[str, Any]) -> set[str]:
    """Audio out unless the request's modalities leave it out (a text-only request skips the vocoder)."""
    modalities = params.get("modalities")
    return {"audio_output"} if modalities is None or "audio" in modalities else set()
