"""`TTSTalkerStage`: the Qwen3-TTS talker on the AR engine (the shared `CodecLMStage` otherwise).

Inputs per request: port `prompt` from the preprocess stage ({"input_ids", "instruct_ids",
"ref_ids", "language", "speaker", "non_streaming"}) and, for a Base checkpoint, port `voice`
from the voice stage ({"spk_embedding": [H], "ref_codes": [T, G] or None, "ref_text"}); when
every inbound edge has ended (`close_input`) the prompt is built and the sequence enters the
engine, batched with every other running request. Sampling: the checkpoint's
generation_config (the graph passes it as `default_sampling`), then the request's
`params["sampling"][<stage name>]`; temperature 0 = greedy talker and code predictor; the
reference's `min_new_tokens=2` holds (codec EOS cannot come first or second).

Emits on `codes`: {"ref_codes": [T, G]} first for an in-context clone (the codec decodes the
reference frames as left context and drops their audio, as the reference does), then
{"codes": int64 [1, G]} per frame (the shared stage's emits), then finish at codec EOS / max_tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import Emit, StageContext
from omni.models.loading import load_part
from omni.models.qwen3_tts.modules.prompt import PromptSpec
from omni.models.qwen3_tts.modules.talker import TTSTalkerModel
from omni.models.qwen3_tts.request import load_tokenizer, ref_text, tokenize
from omni.models.qwen3_tts.stages.args import TTSTalkerArgs
from omni.stages.ar.sequence import SamplingParams
from omni.stages.codec_lm.request import STATE_KEY
from omni.stages.codec_lm.stage import CodecLMStage, CodecLMStream

MIN_NEW_TOKENS = 2  # the reference's generate: codec EOS is suppressed for the first two codes


class TTSTalkerStage(CodecLMStage):
    codes_port = "codes"
    Args = TTSTalkerArgs

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self._inputs: dict[str, dict[str, Any]] = {}

    def build_model(self) -> TTSTalkerModel:
        """`args.model` (a built TTSTalkerModel, in-process) or the checkpoint in `args.model_dir`."""
        model = self.ctx.args.model
        if isinstance(model, TTSTalkerModel):
            return model
        return load_part(TTSTalkerModel, self.ctx.args, self.ctx.device, default_dtype="float32")

    def engine_ready(self) -> None:
        self.model = self.engine.model
        self.model.max_model_len = self.engine.config.max_model_len
        args = self.ctx.args
        if args.predictor_top_k is not None:
            self.model.predictor_top_k = args.predictor_top_k
        if args.predictor_top_p is not None:
            self.model.predictor_top_p = args.predictor_top_p
        cfg = self.engine.config
        if cfg.graphs_on:
            self.model.use_predictor_graphs(cfg.cuda_graph_max_batch or cfg.max_num_seqs)
        if "voice" in self.ctx.in_ports:  # an in-context clone tokenizes its transcript: load it now, not then
            load_tokenizer(self.ctx.args.model_dir)

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
        if pending is not None:  # the channel's arrays are valid during this call only: host copies
            pending[port] = {k: _host(v) for k, v in data.items()}

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
        ref_codes = None if ref_codes is None else torch.from_numpy(np.asarray(ref_codes, dtype=np.int64))
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
                                         self.ctx.args.predictor_temperature)
        if ref_codes is not None:
            self._errors.append(Emit(rid, self.codes_port, {"ref_codes": ref_codes.numpy().astype(np.int64)}))
        self.engine.add_request(rid, [self.model.placeholder_id] * req.prefill_len, sampling,
                                inputs={STATE_KEY: req})
        self._streams[rid] = CodecLMStream(req, sampling, submitted=True)

    def _ref_ids(self, voice: dict[str, Any]) -> list[int]:
        """The reference transcript's ids, in the reference's format (tokenized here: an uploaded
        voice's transcript comes from the voice store, not from the request)."""
        text = voice.get("ref_text")
        if not isinstance(text, str) or not text.strip():
            raise InvalidRequest("in-context voice cloning needs the reference clip's transcript")
        return tokenize(load_tokenizer(self.ctx.args.model_dir), ref_text(text))

    def abort(self, rid: str) -> None:
        self._inputs.pop(rid, None)
        super().abort(rid)

    def backlog(self) -> int:
        return super().backlog() + len(self._inputs)

    def warm_requests(self) -> list:
        """Requests whose prefills have each warm length, through the serving path, 3 frames each.
        A streamed text's prefill is ~9 rows whatever its length (the text trails), so lengths
        come from what does enter the prefill: the instruction (CustomVoice / VoiceDesign) or, for
        a Base checkpoint, an in-context voice's reference frames and transcript (its path: the
        transcript's tokenizer, the frame sums, the codec's reference-codes start)."""
        cfg = self.model.cfg
        pad = cfg.text.tts_pad
        ids = [cfg.text.im_start, pad, pad, pad, cfg.text.im_end, pad, cfg.text.im_start, pad, pad]
        base = "voice" in self.ctx.in_ports
        out = []
        for extra in sorted({max(1, n - 12) for n in self.warm_lengths()}):  # prefills of ~ extra + 9 rows
            prompt = {"input_ids": ids, "language": "auto", "speaker": next(iter(cfg.speakers), None)}
            chunks = [("prompt", prompt)]
            if base:
                codes = np.zeros((extra, cfg.num_code_groups), dtype=np.int64)
                chunks.append(("voice", {"spk_embedding": np.zeros(cfg.talker.hidden_size, np.float32),
                                         "ref_codes": codes, "ref_text": "warm"}))
            else:
                prompt["instruct_ids"] = [pad] * extra
            params = {"sampling": {self.ctx.name: {"max_tokens": 3, "ignore_eos": True}}}
            out.append((params, chunks))
        return out


def _host(value: Any) -> Any:
    """A host (numpy) copy of an array or tensor on any device; other values as they are. A
    cuda_ipc edge (voice stage and talker both on a GPU) delivers tensors on the device."""
    if isinstance(value, torch.Tensor):
        value = value.detach().to("cpu", copy=True)
        return (value.float() if value.dtype == torch.bfloat16 else value).numpy()
    if isinstance(value, np.ndarray):
        return value.copy()
    return value


def _tensor(value: Any) -> torch.Tensor | None:
    if value is None:
        return None
    return torch.from_numpy(np.array(_host(value), dtype=np.float32, copy=True))
