"""`TalkerStage`: the Qwen3-Omni talker on the AR engine (the shared `CodecLMStage`), fed by the
thinker's hidden-state stream.

Per request: `open` takes the voice (`params["voice"]` or `params["speaker"]`) and the talker's sampling
(`params["sampling"][<stage name>]`: temperature, top_k, top_p, repetition_penalty, max_tokens,
seed; temperature 0 = greedy). `feed(rid, "hidden", data)` takes the thinker's rows for its
newest tokens, as {"embed": layer 0, "hidden": layer accept_hidden_layer, "token_ids"} (the
first chunk holds the prompt, or its first `prompt_len` rows do) or
as the engine's taps {"tap_start", "layer_0", "layer_<accept_hidden_layer>"}; the prompt's
token ids come from `params["prompt_token_ids"]` or the first chunk's `token_ids`. A prompt
with images / videos also needs their grids (`image_grid_thw`, `video_grid_thw`,
`video_second_per_grid`, as the vision encoder sends them) in a chunk on any port. As soon
as the prefill can be built the sequence enters the engine; later steps park until the
thinker row they need arrives, or `close_input` says the thinker is done. A request whose
modalities leave audio out ends at once, without work.

Each step emits Emit(rid, "codes", {"codes": int64 [1, num_code_groups]}) per new frame
and Emit(rid, finish=True) at codec EOS or max_tokens (`CodecLMStage.emits_for`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import torch

from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import Emit
from omni.models.loading import load_part
from omni.models.qwen3_omni.checkpoint.random_load import random_part
from omni.models.qwen3_omni.modules.rope import VisionGrid
from omni.models.qwen3_omni.modules.talker import TalkerModel
from omni.models.qwen3_omni.request import voice_of, wants_audio
from omni.models.qwen3_omni.stages.args import TalkerArgs
from omni.stages.codec_lm.request import STATE_KEY
from omni.stages.codec_lm.stage import CodecLMStage, CodecLMStream

DEFAULT_SPEAKER = "ethan"

GRID_KEYS = {"image_grid_thw", "video_grid_thw"}
THINKER_KEYS = {"embed", "layer_0"}


def _grids(value: Any, seconds: Any = None, audio_tokens: Any = None) -> list[VisionGrid]:
    """[n, 3] (t, h, w) rows (+ seconds per temporal step and interleaved audio tokens for videos) -> grids."""
    if value is None:
        return []
    rows = np.asarray(value.cpu() if isinstance(value, torch.Tensor) else value, dtype=np.int64).reshape(-1, 3)
    secs = [1.0] * len(rows) if seconds is None else [float(x) for x in np.asarray(seconds, dtype=np.float64).ravel()]
    audio = [0] * len(rows) if audio_tokens is None else [int(x) for x in np.asarray(audio_tokens).ravel()]
    if len(secs) != len(rows) or len(audio) != len(rows):
        raise InvalidRequest(f"{len(rows)} video grids but {len(secs)} seconds-per-grid values")
    return [VisionGrid(int(t), int(h), int(w), s, a) for (t, h, w), s, a in zip(rows, secs, audio)]


def _tensor(value: Any) -> torch.Tensor:
    """A chunk's rows as a tensor. A channel's view (cuda_ipc) is not copied: TalkerInputs reads it at
    once (projects it, or clones the prompt rows it keeps), and its slot goes back only after the GPU
    has read it (the actor holds the credit): two launches a stream and token fewer at decode."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    return torch.from_numpy(np.array(value, copy=True))


class TalkerStage(CodecLMStage):
    Args = TalkerArgs

    # ---- set-up ---------------------------------------------------------------------
    def build_model(self) -> TalkerModel:
        """`args.model` (a built TalkerModel, in-process) or `args.model_dir`."""
        args = self.ctx.args
        model = args.model
        if model is None:
            if not args.model_dir and args.model_factory is not None:
                return super().build_model()
            model = load_part(TalkerModel, args, self.ctx.device, random=partial(random_part, "talker"),
                              default_dtype="float32")
        return model

    def engine_ready(self) -> None:
        super().engine_ready()
        self._accept = self.model.cfg.talker.accept_hidden_layer
        self.model.defer_text_rows(str(self.ctx.args.device).startswith("cuda") and self.ctx.args.batch_text_rows)

    def has_work(self) -> bool:
        return super().has_work() or (self.engine is not None and self.model.text_rows_waiting())

    def step(self) -> list[Emit]:
        """The text rows fed since the last step projected first (one GEMM for every stream), within
        the round that took them."""
        if self.engine is not None:
            self.model.flush_text_rows()
        return super().step()

    # ---- requests -------------------------------------------------------------------
    def open(self, rid: str, params: dict[str, Any]) -> None:
        if not wants_audio(params):
            self._errors.append(Emit(rid, finish=True))
            return
        try:
            sampling = self.sampling_params(params)
            speaker = voice_of(params) or self.ctx.args.speaker or DEFAULT_SPEAKER
            prompt = params.get("prompt_token_ids")
            req = self.model.new_request(speaker, sampling.greedy, sampling.seed, list(prompt) if prompt else None)
        except InvalidRequest as exc:
            self._errors.append(Emit(rid, error=str(exc), error_kind=exc.kind))
            return
        self._streams[rid] = CodecLMStream(req, sampling)

    def warm_requests(self) -> list:
        """A user turn of each prefill bucket's length and an assistant turn, with zero thinker rows,
        through the serving path (open / feed / close_input), at the default sampling."""
        ids, width = self.model.ids, self.model.cfg.talker.thinker_hidden_size
        out = []
        for n in self.warm_lengths():
            prompt = [ids.im_start, ids.user] + [11] * max(1, n - 5) + [ids.im_start, ids.assistant, 198]
            rows = torch.zeros(len(prompt) + 2, width)
            chunk = {"embed": rows, "hidden": rows, "token_ids": prompt + [11, 11], "prompt_len": len(prompt)}
            params = {"sampling": {self.ctx.name: {"max_tokens": 3, "ignore_eos": True}}}
            out.append((params, [("hidden", chunk)]))
        return out

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        stream = self._streams.get(rid)
        if stream is None:
            return
        try:
            self._feed(rid, stream, data)
        except InvalidRequest as exc:
            self._fail(rid, exc)

    def _feed(self, rid: str, stream: CodecLMStream, data: dict[str, Any]) -> None:
        inputs = stream.request.inputs
        if GRID_KEYS & data.keys():
            inputs.add_grids(_grids(data.get("image_grid_thw")),
                             _grids(data.get("video_grid_thw"), data.get("video_second_per_grid"),
                                    data.get("video_audio_tokens")))
            if not THINKER_KEYS & data.keys():
                self._maybe_submit(rid, stream)
                return
        embed, hidden = data.get("embed"), data.get("hidden")
        if embed is None:
            embed, hidden = data.get("layer_0"), data.get(f"layer_{self._accept}")
            start = data.get("tap_start")
            if start is not None and int(start) != inputs.num_rows:
                raise InvalidRequest(f"talker: thinker rows from {start}, expected {inputs.num_rows}")
        if embed is None or hidden is None:
            raise InvalidRequest(f"talker: thinker chunk lacks embed/hidden rows (keys {sorted(data)})")
        if inputs.prompt_ids is None:
            ids = data.get("token_ids")
            n = int(data.get("prompt_len", len(embed)))
            if ids is None or len(ids) < n:
                raise InvalidRequest("talker: no prompt token ids (request params or first chunk)")
            inputs.set_prompt([int(t) for t in list(ids)[:n]])
        inputs.feed(_tensor(embed), _tensor(hidden))
        self._maybe_submit(rid, stream)

    def _maybe_submit(self, rid: str, stream: CodecLMStream) -> None:
        prefill = stream.request.inputs.prefill
        if stream.submitted or prefill is None:
            return
        prompt = [self.model.placeholder_id] * int(prefill.shape[0])
        self.engine.add_request(rid, prompt, stream.sampling, inputs={STATE_KEY: stream.request})
        stream.submitted = True

    def close_input(self, rid: str) -> None:
        stream = self._streams.get(rid)
        if stream is None:
            return
        stream.request.inputs.finish()
        if stream.request.inputs.waiting_for_grids:
            self._fail(rid, InvalidRequest("talker: the prompt has image/video tokens but no vision grids came"))
        elif stream.request.inputs.starved:
            # The thinker ended before its first generated token had a row: nothing to say.
            self._streams.pop(rid)
            self._errors.append(Emit(rid, finish=True))
