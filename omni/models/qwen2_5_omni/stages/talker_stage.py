"""`TalkerStage`: the Qwen2.5-Omni talker (modules/talker.py) on the AR engine, fed by the thinker's
hidden-state stream, streaming its codec tokens to token2wav.

Per request: `open` takes the voice (`params["voice"]` or `params["speaker"]`, else `args.speaker`, else
the checkpoint's first speaker) and the sampling (transformers' talker defaults, `args.default_sampling`,
then `params["sampling"][<stage name>]`; temperature 0 = greedy). `feed(rid, "hidden", chunk)` takes the
thinker's taps {"tap_start", "token_ids", "prompt_len", "layer_0", "layer_<last>"}; image / video grids
may come in a chunk on any port. The sequence enters the engine once the prompt's rows and the first
generated token's row are in; later steps park until their row arrives or the thinker ends
(`close_input`). A request whose modalities leave audio out ends at once, without work.

Emits Emit(rid, "codes", {"codes": int64 [n]}) with each step's new code (the stop code is not sent)
and Emit(rid, finish=True) at the stop code or max_tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import Emit
from omni.models.loading import load_part
from omni.models.qwen2_5_omni.checkpoint.random_load import random_part
from omni.stages.multimodal.request import voice_of, wants_audio
from omni.models.qwen2_5_omni.modules.talker import STATE_KEY, Qwen2_5OmniTalker, ThinkerRows, prompt_rows
from omni.models.qwen2_5_omni.stages.args import TalkerArgs
from omni.stages.ar.engine import StepOutput
from omni.stages.ar.sequence import SamplingParams
from omni.stages.ar.stage import ARStage
from omni.stages.sampling import merged_sampling

# transformers' Qwen2.5-Omni `generate` defaults for the talker
DEFAULT_SAMPLING = {"temperature": 0.9, "top_k": 40, "top_p": 0.8, "repetition_penalty": 1.05, "max_tokens": 4096}
GRID_KEYS = ("image_grid_thw", "video_grid_thw", "video_second_per_grid")


@dataclass
class _Stream:
    rows: ThinkerRows
    sampling: SamplingParams
    speaker: str
    submitted: bool = False


def _tensor(value: Any, like: torch.Tensor) -> torch.Tensor:
    t = value.detach().clone() if isinstance(value, torch.Tensor) else torch.from_numpy(np.array(value, copy=True))
    return t.to(like.device, like.dtype)


class TalkerStage(ARStage):
    Args = TalkerArgs
    batched_ports = ("codes",)  # every stream's code of a step: one message to token2wav

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._streams: dict[str, _Stream] = {}

    def build_model(self) -> Qwen2_5OmniTalker:
        args = self.ctx.args
        if args.model is not None:
            return args.model
        return load_part(Qwen2_5OmniTalker, args, self.ctx.device,
                         random=partial(random_part, "talker"), default_dtype="float32")

    def engine_ready(self) -> None:
        self.model: Qwen2_5OmniTalker = self.engine.model
        self._last = f"layer_{self.model.cfg.thinker.text.num_layers}"

    def sampling_params(self, params: dict[str, Any]) -> SamplingParams:
        def stops(merged: dict[str, Any]) -> None:
            merged["stop_token_ids"] = () if merged.get("ignore_eos") else self.model.stop_ids
            if merged.get("ignore_eos"):
                merged["suppress_token_ids"] = self.model.stop_ids

        return merged_sampling({**DEFAULT_SAMPLING, **self.ctx.args.default_sampling}, params, self.ctx.name, stops)

    def warm_requests(self) -> list:
        """A prompt of each prefill bucket's length with zero thinker rows, through the serving path."""
        width, out = self.model.cfg.talker.embedding_size, []
        for n in self.warm_lengths():
            prompt = max(1, n - 2)
            rows = np.zeros((prompt + 2, width), dtype=np.float32)  # the prompt's, then two reply rows
            chunk = {"tap_start": 0, "token_ids": [11] * (prompt + 2), "prompt_len": prompt, "layer_0": rows,
                     self._last: rows}
            out.append(({"sampling": {self.ctx.name: {"max_tokens": 3, "ignore_eos": True}}}, [("hidden", chunk)]))
        return out

    # ---- requests -------------------------------------------------------------------
    def open(self, rid: str, params: dict[str, Any]) -> None:
        if not wants_audio(params):
            self._errors.append(Emit(rid, finish=True))
            return
        try:
            speaker = voice_of(params) or self.ctx.args.speaker.lower() or next(iter(self.model.speakers))
            if speaker not in self.model.speakers:
                raise InvalidRequest(f"unknown voice {speaker!r}; this model's voices are: "
                                     f"{', '.join(self.model.speakers)}")
            self._streams[rid] = _Stream(ThinkerRows(), self.sampling_params(params), speaker)
        except InvalidRequest as exc:
            self._errors.append(Emit(rid, error=str(exc), error_kind=exc.kind))

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        stream = self._streams.get(rid)
        if stream is None:
            return
        try:
            self._feed(stream, data)
        except InvalidRequest as exc:
            self._fail(rid, exc)
            return
        self._maybe_submit(rid, stream)

    def _feed(self, stream: _Stream, data: dict[str, Any]) -> None:
        rows = stream.rows
        rows.grids.update({k: data[k] for k in GRID_KEYS if k in data})
        if "layer_0" not in data:
            return
        like = self.model.text_rows
        embed, hidden = _tensor(data["layer_0"], like), data.get(self._last)
        if hidden is None:
            raise InvalidRequest(f"talker: thinker chunk lacks {self._last} (keys {sorted(data)})")
        hidden = _tensor(hidden, like)
        start = int(data.get("tap_start", 0))
        if rows.prompt is None:
            n = int(data.get("prompt_len", len(embed)))
            ids = [int(t) for t in list(data.get("token_ids") or [])[:n]]
            if start != 0 or len(ids) != n or len(embed) < n:
                raise InvalidRequest("talker: the first thinker chunk must hold the whole prompt with its token ids")
            rows.prompt_ids, rows.prompt = ids, prompt_rows(self.model, ids, embed[:n], hidden[:n])
            embed, hidden = embed[n:], hidden[n:]
        elif start != len(rows.prompt_ids) + len(rows.reply):
            raise InvalidRequest(f"talker: thinker rows from {start}, expected {len(rows.prompt_ids) + len(rows.reply)}")
        rows.reply.extend(hidden + embed)

    def _maybe_submit(self, rid: str, stream: _Stream) -> None:
        if stream.submitted or not stream.rows.ready():
            return
        prompt = self.model.prompt_ids(len(stream.rows.prompt_ids))
        self.engine.add_request(rid, prompt, stream.sampling, inputs={STATE_KEY: stream.rows, "speaker": stream.speaker})
        stream.submitted = True

    def close_input(self, rid: str) -> None:
        stream = self._streams.get(rid)
        if stream is None:
            return
        stream.rows.closed = True
        if not stream.submitted:  # the thinker ended before its first token had a row: nothing to say
            self._streams.pop(rid)
            self._errors.append(Emit(rid, finish=True))

    def abort(self, rid: str) -> None:
        self._streams.pop(rid, None)
        super().abort(rid)

    def _fail(self, rid: str, exc: InvalidRequest) -> None:
        self.abort(rid)
        self._errors.append(Emit(rid, error=str(exc), error_kind=exc.kind))

    # ---- stepping -------------------------------------------------------------------
    def emits_for(self, out: StepOutput) -> list[Emit]:
        if out.error is not None:
            self._streams.pop(out.rid, None)
            return super().emits_for(out)
        emits = []
        codes = [t for t in out.new_token_ids if t not in self.model.stop_ids]
        if codes:
            emits.append(Emit(out.rid, "codes", {"codes": np.asarray(codes, dtype=np.int64)}))
        if out.finished:
            self._streams.pop(out.rid, None)
            emits.append(Emit(out.rid, finish=True))
        return emits

    def backlog(self) -> int:
        waiting = len(self.engine.scheduler.waiting) if self.engine else 0
        return waiting + sum(not s.submitted for s in self._streams.values())
