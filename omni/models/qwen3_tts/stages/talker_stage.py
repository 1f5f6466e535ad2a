"""`TTSTalkerStage`: the Qwen3-TTS talker on the AR engine (Qwen3-Omni's `TalkerStage` otherwise).

Inputs per request: port `prompt` from the preprocess stage ({"input_ids", "instruct_ids",
"ref_ids", "language", "speaker", "non_streaming"}) and, for a Base checkpoint, port `voice`
from the voice stage ({"spk_embedding": [H], "ref_codes": [T, G] or None, "ref_text"}); when
every inbound edge has ended (`close_input`) the prompt is built and the sequence enters the
engine, batched with every other running request. Sampling: the checkpoint's
generation_config (the graph passes it as `default_sampling`), then the request's
`params["sampling"]["talker"]`; temperature 0 = greedy talker and code predictor; the
reference's `min_new_tokens=2` holds (codec EOS cannot come first or second).

Emits on `codes`: {"ref_codes": [T, G]} first for an in-context clone (the codec decodes the
reference frames as left context and drops their audio, as the reference does), then
{"codes": int64 [1, G]} per frame (Qwen3-Omni's emits), then finish at codec EOS / max_tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import Emit, StageContext
from omni.models.qwen3_omni.stages.talker_stage import TalkerStage, _Stream
from omni.models.loading import load_part
from omni.models.qwen3_tts.modules.prompt import PromptSpec
from omni.models.qwen3_tts.modules.talker import TTSTalkerModel
from omni.models.qwen3_tts.request import load_tokenizer, ref_text, tokenize
from omni.stages.ar.sequence import SamplingParams

MIN_NEW_TOKENS = 2  # the reference's generate: codec EOS is suppressed for the first two codes


class TTSTalkerStage(TalkerStage):
    codes_port = "codes"
    sampling_key = "talker"

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self._inputs: dict[str, dict[str, Any]] = {}

    def build_model(self) -> TTSTalkerModel:
        """`args["model"]` (a built TTSTalkerModel, in-process) or the checkpoint in `args["model_dir"]`."""
        model = self.ctx.args.get("model")
        if isinstance(model, TTSTalkerModel):
            return model
        return load_part(TTSTalkerModel, self.ctx.args, self.ctx.device, default_dtype="float32")

    def engine_ready(self) -> None:
        self.model = self.engine.model
        self.model.max_model_len = self.engine.config.max_model_len
        args = self.ctx.args
        self.model.predictor_top_k = int(args.get("predictor_top_k", self.model.predictor_top_k))
        self.model.predictor_top_p = float(args.get("predictor_top_p", self.model.predictor_top_p))
        cfg = self.engine.config
        if cfg.cuda_graphs:
            self.model.use_predictor_graphs(cfg.cuda_graph_max_batch or cfg.max_num_seqs)

    def sampling_params(self, params: dict[str, Any]) -> SamplingParams:
        sampling = super().sampling_params(params)
        if not sampling.ignore_eos and not sampling.suppress_token_ids:
            sampling.min_tokens = MIN_NEW_TOKENS
        return sampling

    # ---- requests -------------------------------------------------------------------
    def open(self, rid: str, params: dict[str, Any]) -> None:
        try:
            sampling = self.sampling_params(params)
        except InvalidRequest as exc:
            self._errors.append(Emit(rid, error=str(exc), error_kind=exc.kind))
            return
        self._inputs[rid] = {"sampling": sampling}

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        pending = self._inputs.get(rid)
        if pending is not None:
            pending[port] = dict(data)

    def close_input(self, rid: str) -> None:
        pending = self._inputs.pop(rid, None)
        if pending is None:
            return
        try:
            self._submit_tts(rid, pending)
        except InvalidRequest as exc:
            self._errors.append(Emit(rid, error=str(exc), error_kind=exc.kind))

    def _submit_tts(self, rid: str, pending: dict[str, Any]) -> None:
        prompt = pending.get("prompt")
        if prompt is None:
            raise InvalidRequest("talker: no prompt arrived")
        voice = pending.get("voice") or {}
        if "voice" in self.ctx.in_ports and voice.get("spk_embedding") is None:
            raise InvalidRequest("talker: a Base checkpoint speaks in a cloned voice: no speaker embedding arrived")
        ref_codes = voice.get("ref_codes")
        ref_codes = None if ref_codes is None else torch.as_tensor(np.asarray(ref_codes), dtype=torch.long)
        spec = PromptSpec(
            input_ids=[int(t) for t in prompt["input_ids"]],
            language=str(prompt.get("language") or "auto"),
            speaker=prompt.get("speaker"),
            instruct_ids=[int(t) for t in prompt["instruct_ids"]] if prompt.get("instruct_ids") else None,
            spk_embedding=_tensor(voice.get("spk_embedding")),
            ref_ids=self._ref_ids(voice) if ref_codes is not None else None,
            ref_codes=ref_codes,
            non_streaming=bool(prompt.get("non_streaming", False)),
        )
        sampling: SamplingParams = pending["sampling"]
        req = self.model.new_tts_request(spec, sampling.greedy, sampling.seed,
                                         float(self.ctx.args.get("predictor_temperature", 0.9)))
        if ref_codes is not None:
            self._errors.append(Emit(rid, self.codes_port, {"ref_codes": ref_codes.numpy().astype(np.int64)}))
        self.engine.add_request(rid, [self.model.placeholder_id] * req.prefill_len, sampling,
                                inputs={"talker": req})
        self._streams[rid] = _Stream(req, sampling, submitted=True)

    def _ref_ids(self, voice: dict[str, Any]) -> list[int]:
        """The reference transcript's ids, in the reference's format (tokenized here: an uploaded
        voice's transcript comes from the voice store, not from the request)."""
        text = voice.get("ref_text")
        if not isinstance(text, str) or not text.strip():
            raise InvalidRequest("in-context voice cloning needs the reference clip's transcript")
        return tokenize(load_tokenizer(str(self.ctx.args["model_dir"])), ref_text(text))

    def abort(self, rid: str) -> None:
        self._inputs.pop(rid, None)
        super().abort(rid)

    def backlog(self) -> int:
        return super().backlog() + len(self._inputs)

    def warm_requests(self) -> list:
        """A prompt of each prefill bucket's length through the serving path, 3 frames each."""
        cfg = self.model.cfg
        ids = [cfg.text.im_start, cfg.text.tts_pad, cfg.text.tts_pad]
        tail = [cfg.text.im_end, cfg.text.tts_pad, cfg.text.im_start, cfg.text.tts_pad, cfg.text.tts_pad]
        out = []
        for n in self.warm_lengths():
            text = [cfg.text.tts_pad] * max(1, n - 10)
            prompt = {"input_ids": ids + text + tail, "language": "auto",
                      "speaker": next(iter(cfg.speakers), None)}
            chunks = [("prompt", prompt)]
            if "voice" in self.ctx.in_ports:
                chunks.append(("voice", {"spk_embedding": torch.zeros(cfg.talker.hidden_size)}))
            params = {"sampling": {self.sampling_key: {"max_tokens": 3, "ignore_eos": True}}}
            out.append((params, chunks))
        return out


def _tensor(value: Any) -> torch.Tensor | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value.detach().clone().float()
    return torch.from_numpy(np.array(value, dtype=np.float32, copy=True))
