"""The Whisper decoder stage: every window of every request is one sequence on the AR engine.

A request's windows arrive from the encoder stage as chunks; each becomes an engine sequence
as soon as its language is known (given, English-only model, or detected from window 0 by one
constrained decoder step). Windows decode in parallel with every other request's (continuous
batching); finished windows leave in order on `text` as {"text", "token_ids", "window",
"language", "segments"?}, and the request ends with its usage once its last window is out.
With timestamps, a pass that stops mid-segment is followed by another from its last timestamp
(`seek`; the encoder for those passes is loaded here on first use).
At most `max_num_seqs` windows are in the engine at once (each holds its cross-attention
keys/values, ~8x its encoder output); the others wait as encoder outputs, oldest request first.

Request params read: task ("transcribe" | "translate"), language (code, name or None),
stream (bool: the head window's text is also sent as it decodes, `partial` chunks without token ids),
timestamps (bool: segments with times, as verbose_json / srt / vtt need), word_timestamps (bool:
"words" [{"word", "start", "end"}] per window, aligned by `alignment`), prompt (previous
text), sampling[<stage name>] (temperature, max_tokens, seed, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import torch

from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import Emit, Stage, StageContext
from omni.models.whisper.modules.alignment import alignment_heads, alignment_weights, token_times, words
from omni.models.whisper.config import WhisperConfig
from omni.models.whisper.modules.decoder import WhisperDecoder
from omni.models.whisper.stages.args import WhisperDecoderArgs
from omni.models.whisper.stages.encoder_stage import WhisperBatchEncoder
from omni.models.whisper.modules.features import WINDOW_FRAMES
from omni.models.whisper.modules.logits import RULES, DecodeRules
from omni.models.whisper.stages.seek import cut, shifted_mel
from omni.models.whisper.stages.stats import STATS, DecodeStats, compression_ratio
from omni.models.whisper.stages.transcript import WhisperText, join_texts
from omni.stages.args import coerce_args
from omni.stages.ar.config import EngineConfig
from omni.stages.ar.engine import AREngine
from omni.stages.ar.sequence import SamplingParams
from omni.stages.sampling import merged_sampling
from omni.stages.threads import pin_torch_threads

DETECT = "lang"  # engine rid suffix of a language-detection sequence (windows: "<index>:<pass>")
PROBE = "ns"  # engine rid suffix of a no-speech probe ("<index>:<pass>:ns")
FRAMES_PER_SECOND = 100


@dataclass
class _Window:
    encoder_out: torch.Tensor | None  # what the next pass attends to (None while one is in the engine)
    offset_s: float
    duration_s: float
    mel: torch.Tensor | None = None  # kept for a timestamp seek
    seek: int = 0  # log-mel frames of the window already decoded by earlier passes
    passes: list[tuple[int, list[int], DecodeStats | None]] = field(default_factory=list)  # (seek, kept, stats)
    stats: DecodeStats | None = None  # the pass in the engine's (with timestamps: verbose_json reports them)
    probes: int = 0  # no-speech probes of this window still in the engine
    memory: torch.Tensor | None = None  # word timestamps: the pass's encoder output and prompt, to align on
    prompt: list[int] = field(default_factory=list)
    words: list[dict] = field(default_factory=list)
    done: bool = False

    @property
    def tokens(self) -> list[int]:
        return [t for _, kept, _ in self.passes for t in kept]


@dataclass
class _Request:
    task: str
    language: int | None
    timestamps: bool
    prompt_text: str | None
    sampling: SamplingParams
    windows: dict[int, _Window] = field(default_factory=dict)
    num_windows: int | None = None
    live: set[str] = field(default_factory=set)  # engine request ids of this request
    detecting: bool = False
    emitted: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    texts: list[str] = field(default_factory=list)
    words: bool = False  # word timestamps asked for (alignment.py)
    stream: bool = False  # text as it is decoded: the head window's new text every step
    partial: str = ""  # text of the head window already sent


class WhisperDecoderStage(Stage):
    """args: `WhisperDecoderArgs` (stages/args.py)."""

    def __init__(self, ctx: StageContext) -> None:
        ctx.args = coerce_args(WhisperDecoderArgs, ctx.args, ctx.name)
        super().__init__(ctx)
        self.requests: dict[str, _Request] = {}
        self.errors: list[Emit] = []
        self.outputs: dict[str, list[int]] = {}  # engine rid -> tokens so far
        self.probes: dict[str, tuple[DecodeStats, DecodeStats]] = {}  # probe rid -> (its pass's stats, its own)
        self.seek_encoder: WhisperBatchEncoder | None = None
        self.engine: AREngine | None = None

    def setup(self) -> None:
        args = self.ctx.args
        pin_torch_threads(args.threads)
        model_dir = args.model_dir
        self.cfg = WhisperConfig.from_dir(model_dir)
        self.text = WhisperText(model_dir, self.cfg)
        self.alignment_heads = alignment_heads(model_dir)
        dtype = getattr(torch, args.dtype)
        model = WhisperDecoder.from_pretrained(model_dir, self.cfg, dtype, self.ctx.device)
        max_len = self.cfg.max_target_positions
        max_seqs = self.max_seqs = args.max_num_seqs
        block = args.block_size
        # KV room for 256 tokens a window on average (most transcripts are far shorter; the engine
        # preempts when a batch of long ones runs out)
        num_blocks = args.num_blocks or max(max_seqs * 256, max_len) // block
        engine_cfg = EngineConfig(block_size=block, num_blocks=num_blocks, max_num_seqs=max_seqs,
                                  max_num_batched_tokens=args.max_num_batched_tokens,
                                  max_model_len=max_len, device=self.ctx.device, eos_token_ids=(self.cfg.eot,))
        self.engine = AREngine(model, engine_cfg)

    # ---- requests -----------------------------------------------------------------
    def open(self, rid: str, params: dict[str, Any]) -> None:
        cfg = self.cfg
        task = params.get("task") or "transcribe"
        language = params.get("language")
        lang_id = None
        if language:
            lang_id = cfg.language_token(str(language))
        if not cfg.multilingual:
            if task == "translate":
                raise InvalidRequest("this Whisper is English-only: it cannot translate")
            if lang_id is not None and lang_id != cfg.language_token("en"):
                raise InvalidRequest(f"this Whisper is English-only; language {language!r} is not supported")
        sampling = merged_sampling({"max_tokens": cfg.max_target_positions // 2, **self.ctx.args.default_sampling},
                                   params, self.ctx.name)
        prompt = params.get("prompt")
        words = bool(params.get("word_timestamps"))
        if words and not self.alignment_heads:
            raise InvalidRequest("this Whisper checkpoint names no alignment heads (generation_config.json): "
                                 "it cannot time words")
        self.requests[rid] = _Request(task, lang_id, bool(params.get("timestamps")) or words,
                                      prompt if isinstance(prompt, str) else None, sampling,
                                      words=words, stream=bool(params.get("stream")) and not params.get("timestamps"))

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        req = self.requests.get(rid)
        if req is None:
            return
        index = int(data["window"])
        req.num_windows = int(data["windows"])
        mel = data.get("mel")
        req.windows[index] = _Window(torch.as_tensor(data["encoder_out"]).clone(), float(data["offset_s"]),
                                     float(data["duration_s"]), None if mel is None else torch.as_tensor(mel).clone())
        self._submit_ready(rid, req)

    def close_input(self, rid: str) -> None:
        req = self.requests.get(rid)
        if req is not None and req.num_windows is None:
            self.errors.append(Emit(rid, error="the encoder sent no audio windows", error_kind="invalid_request"))
            self.abort(rid)

    def abort(self, rid: str) -> None:
        req = self.requests.pop(rid, None)
        if req is None or self.engine is None:
            return
        for engine_rid in req.live:
            self.engine.abort(engine_rid)
            self.outputs.pop(engine_rid, None)
            self.probes.pop(engine_rid, None)

    # ---- submission -----------------------------------------------------------------
    def _rules(self, req: _Request, allowed: tuple[int, ...] = ()) -> DecodeRules:
        cfg = self.cfg
        return DecodeRules(cfg.eot, cfg.no_timestamps, cfg.timestamp_begin, tuple(cfg.suppress_tokens),
                           tuple(cfg.begin_suppress_tokens), req.timestamps, cfg.max_initial_timestamp_index, allowed)

    def _submit_ready(self, rid: str, req: _Request) -> None:
        try:
            if self.cfg.multilingual and req.language is None:
                if not req.detecting and 0 in req.windows:
                    req.detecting = True
                    langs = tuple(self.cfg.language_ids().values())
                    self.engine.add_request(f"{rid}/{DETECT}", [self.cfg.sot], SamplingParams(temperature=0.0, max_tokens=1),
                                            inputs={"encoder_out": req.windows[0].encoder_out,
                                                    RULES: self._rules(req, langs)})
                    req.live.add(f"{rid}/{DETECT}")
                return
            prompt = self.text.prompt(req.language, req.task, req.timestamps, req.prompt_text)
            room = self.cfg.max_target_positions - len(prompt)
            params = msgspec.structs.replace(req.sampling, max_tokens=max(1, min(req.sampling.max_tokens, room)))
            for i, window in sorted(req.windows.items()):
                if window.encoder_out is None:
                    continue  # in the engine, or done
                if len(self.engine.seqs) >= self.max_seqs:
                    return  # admitted later (`_admit`): cross keys/values are ~8x an encoder output
                engine_rid = f"{rid}/{i}:{len(window.passes)}"
                inputs = {"encoder_out": window.encoder_out, RULES: self._rules(req)}
                if req.timestamps:
                    window.stats = inputs[STATS] = DecodeStats(self.cfg.no_speech if prompt[-1] == self.cfg.sot else None)
                    if window.stats.no_speech is None:
                        self._probe(rid, req, window, prompt, engine_rid)
                self.engine.add_request(engine_rid, prompt, params, inputs=inputs)
                if req.words:
                    window.memory, window.prompt = window.encoder_out, prompt
                window.encoder_out = None  # the engine holds its cross keys/values now
                req.live.add(engine_rid)
                req.prompt_tokens += len(prompt)
        except InvalidRequest as exc:
            self.errors.append(Emit(rid, error=str(exc), error_kind=exc.kind))
            self.abort(rid)

    def _probe(self, rid: str, req: _Request, window: _Window, prompt: list[int], engine_rid: str) -> None:
        """No-speech probability is read at <|startoftranscript|>: a prompt that goes on past it
        (language, task) gets a one-step probe of the prompt up to there."""
        probe_rid, own = f"{engine_rid}:{PROBE}", DecodeStats(self.cfg.no_speech, sum_logprobs=False)
        self.engine.add_request(probe_rid, prompt[:prompt.index(self.cfg.sot) + 1],
                                SamplingParams(temperature=0.0, max_tokens=1),
                                inputs={"encoder_out": window.encoder_out, STATS: own})
        self.probes[probe_rid] = (window.stats, own)
        window.probes += 1
        req.live.add(probe_rid)

    def _admit(self) -> None:
        """Hand waiting windows to the engine, oldest request first, while it has room."""
        for rid, req in list(self.requests.items()):
            if len(self.engine.seqs) >= self.max_seqs:
                return
            if any(w.encoder_out is not None for w in req.windows.values()):
                self._submit_ready(rid, req)

    # ---- stepping -----------------------------------------------------------------
    def step(self) -> list[Emit]:
        emits, self.errors = self.errors, []
        touched: set[str] = set()
        for out in self.engine.step():
            self.outputs.setdefault(out.rid, []).extend(out.new_token_ids)
            if not out.finished:
                emits.extend(self._partial(out.rid))
                continue
            seq_tokens = self.outputs.pop(out.rid)
            rid, _, part = out.rid.rpartition("/")
            req = self.requests.get(rid)
            if req is None:
                continue
            req.live.discard(out.rid)
            if part == DETECT:
                req.language = seq_tokens[0] if seq_tokens else self.cfg.language_token("en")
                self._submit_ready(rid, req)
            elif part.endswith(f":{PROBE}"):
                stats, own = self.probes.pop(out.rid)
                stats.no_speech_prob = own.no_speech_prob
                req.windows[int(part.partition(":")[0])].probes -= 1
                touched.add(rid)
            else:
                self._pass_done(req, req.windows[int(part.partition(":")[0])], seq_tokens)
                req.completion_tokens += len(seq_tokens)
                touched.add(rid)
        self._admit()
        emits.extend(self.errors)
        self.errors = []
        for rid in touched:
            emits.extend(self._emit_done(rid))
        return emits

    def _pass_done(self, req: _Request, window: _Window, tokens: list[int]) -> None:
        """Keep a finished pass; with timestamps, seek and queue another pass when it stopped mid-segment."""
        tokens = [t for t in tokens if t != self.cfg.eot]
        keep, frames = cut(tokens, self.cfg.timestamp_begin) if req.timestamps else (len(tokens), None)
        window.passes.append((window.seek, tokens[:keep], window.stats))
        if req.words and window.memory is not None:
            window.words += self._words(window, tokens, keep)
            window.memory = None
        if window.stats is not None:  # the average is over the whole pass (openai-whisper's), kept or not
            window.stats.finish(len(tokens))
        if frames is None or window.mel is None or window.seek + frames >= WINDOW_FRAMES:
            window.done, window.mel = True, None
            return
        window.seek += frames
        if self.seek_encoder is None:  # loaded on first use: most requests never seek
            self.seek_encoder = WhisperBatchEncoder(self.ctx.args.model_dir, self.ctx.device, self.ctx.args.dtype)
        window.encoder_out = self.seek_encoder.encode_mel(shifted_mel(window.mel, window.seek)[None])[0]

    def _words(self, window: _Window, tokens: list[int], keep: int) -> list[dict]:
        """The kept text tokens of a pass, grouped into timed words (alignment.py)."""
        weights = alignment_weights(self.engine.model.net, window.memory, window.prompt + tokens, self.alignment_heads)
        times = token_times(weights, len(window.prompt), int(round(window.duration_s * FRAMES_PER_SECOND)) - window.seek)
        text = [(t, times[i]) for i, t in enumerate(tokens[:keep]) if t < self.cfg.eot and i < len(times)]
        return words([self.text.decode([t]) for t, _ in text], [s for _, s in text],
                     window.offset_s + window.seek / FRAMES_PER_SECOND)

    def _window_text(self, req: _Request, tokens: list[int]) -> str:
        """A window's text as it joins the text before it."""
        text = self.text.decode(tokens)
        return join_texts([req.texts[-1], text])[len(req.texts[-1]):] if req.texts else text

    def _partial(self, engine_rid: str) -> list[Emit]:
        """With `stream`, the new text of the head window's first pass, while it decodes (never half
        a character: text that ends in a replacement character waits for the next token)."""
        rid, _, part = engine_rid.rpartition("/")
        req = self.requests.get(rid)
        if req is None or not req.stream or part != f"{req.emitted}:0":
            return []
        text = self._window_text(req, [t for t in self.outputs[engine_rid] if t != self.cfg.eot])
        if text.endswith("\ufffd") or not text.startswith(req.partial) or len(text) == len(req.partial):
            return []
        delta, req.partial = text[len(req.partial):], text
        return [Emit(rid, "text", {"text": delta, "token_ids": [], "window": req.emitted, "partial": True})]

    def _emit_done(self, rid: str) -> list[Emit]:
        req = self.requests.get(rid)
        if req is None:
            return []
        emits = []
        while req.emitted in req.windows and req.windows[req.emitted].done and not req.windows[req.emitted].probes:
            window = req.windows.pop(req.emitted)
            tokens = window.tokens
            text = self._window_text(req, tokens)
            req.texts.append(text)
            sent, req.partial = req.partial if text.startswith(req.partial) else "", ""  # streamed already
            data: dict[str, Any] = {"text": text[len(sent):], "token_ids": tokens, "window": req.emitted,
                                    "language": self._language_code(req.language)}
            if req.timestamps:
                data["segments"] = [seg for seek, kept, stats in window.passes
                                    for seg in self._segments(req, window, seek, kept, stats)]
            if req.words:
                data["words"] = window.words
            emits.append(Emit(rid, "text", data))
            req.emitted += 1
        if req.num_windows is not None and req.emitted >= req.num_windows:
            usage = {"prompt_tokens": req.prompt_tokens, "completion_tokens": req.completion_tokens}
            emits.append(Emit(rid, finish=True, end_meta={"usage": usage, "finish_reason": "stop"}))
            del self.requests[rid]
        return emits

    def _segments(self, req: _Request, window: _Window, seek: int, kept: list[int], stats: DecodeStats | None
                  ) -> list[dict[str, Any]]:
        """One pass's timed segments, each with its pass's statistics (as openai-whisper reports them)."""
        start = seek / FRAMES_PER_SECOND
        segments = self.text.segments(kept, window.offset_s + start, max(0.0, window.duration_s - start))
        facts = {"seek": int(round(window.offset_s * FRAMES_PER_SECOND)) + seek,
                 "temperature": req.sampling.temperature, "compression_ratio": compression_ratio(self.text.decode(kept))}
        if stats is not None:
            facts["avg_logprob"] = stats.avg_logprob
            facts["no_speech_prob"] = stats.no_speech_prob
        return [{**seg.as_dict(), **facts} for seg in segments]

    def _language_code(self, token: int | None) -> str:
        if token is None:
            return "en"
        for code, tid in self.cfg.language_ids().items():
            if tid == token:
                return code
        return "en"

    def has_work(self) -> bool:
        return bool(self.errors) or (self.engine is not None and self.engine.has_work())

    def backlog(self) -> int:
        return sum(1 for r in self.requests.values() for w in r.windows.values() if w.encoder_out is not None)

    def stats(self) -> dict[str, Any]:
        stats = self.engine.stats() if self.engine else {}
        stats["requests"] = len(self.requests)
        return stats
