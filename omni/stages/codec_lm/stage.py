"""`CodecLMStage`: a multi-codebook talker on the AR engine, the stage base every family's talker
stage subclasses (a family adds how requests open and how their prompt rows arrive).

Sampling: transformers' talker defaults, then `args.default_sampling`, then the request's
`params["sampling"][<stage name>]`; temperature 0 = greedy. Each step emits its new frames as
one batched Emit(rows=[rid...], codes_port, {"codes": int64 [rows, num_code_groups]}) (one bus
message per consumer replica, not one per stream; each request's chunk is its row [1, groups]) and
Emit(rid, finish=True) at codec EOS or max_tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import Emit, StageContext
from omni.layers.fused_ops import use_fused_ops
from omni.layers.moe_routed import use_moe_backend
from omni.stages.ar.engine import StepOutput
from omni.stages.ar.sequence import SamplingParams
from omni.stages.ar.stage import ARStage
from omni.stages.codec_lm.args import CodecLMArgs
from omni.stages.codec_lm.model import CodecLM
from omni.stages.codec_lm.request import CodecLMRequest
from omni.stages.sampling import merged_sampling

# transformers' `generate` defaults for the talker
DEFAULT_SAMPLING = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05, "max_tokens": 4096}


@dataclass
class CodecLMStream:
    """One request of the stage: its model state, its sampling, and whether the engine has it."""

    request: CodecLMRequest
    sampling: SamplingParams
    submitted: bool = False


class CodecLMStage(ARStage):
    """A subclass sets `Args`, builds its model
    (`build_model`) and feeds the engine (`open` / `feed` / `close_input`, recording each request
    in `_streams`)."""

    codes_port = "codes"
    batched_ports = ("hidden", "codes")  # every stream's frame of a step: one batched emit
    Args = CodecLMArgs

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.model: CodecLM | None = None
        self._streams: dict[str, CodecLMStream] = {}

    # ---- set-up ---------------------------------------------------------------------
    def setup(self) -> None:
        use_fused_ops(self.ctx.args.fused_ops)  # once per process, before any forward
        use_moe_backend(self.ctx.args.moe_backend)
        super().setup()

    def engine_ready(self) -> None:
        self.model = self.engine.model
        self.model.max_model_len = self.engine.config.max_model_len
        cfg = self.engine.config
        if cfg.graphs_on:  # the code predictor's 15-step loop as one CUDA graph per batch bucket
            self.model.use_predictor_graphs(cfg.cuda_graph_max_batch or cfg.max_num_seqs)

    # ---- requests -------------------------------------------------------------------
    def sampling_params(self, params: dict[str, Any]) -> SamplingParams:
        """transformers' talker defaults, then `args.default_sampling`, then the request's fields for
        this stage; codec EOS stops (with `ignore_eos` it is suppressed instead, so the
        talker makes exactly max_tokens frames), the codec specials are suppressed and
        the repetition penalty covers generated codes only, as in transformers."""
        return merged_sampling({**DEFAULT_SAMPLING, **self.ctx.args.default_sampling}, params, self.ctx.name,
                               self._codec_stops)

    def _codec_stops(self, merged: dict[str, Any]) -> None:
        if merged.get("ignore_eos"):  # exactly max_tokens frames: codec EOS is never sampled
            merged["stop_token_ids"] = ()
            merged["suppress_token_ids"] = (self.model.ids.codec_eos,)
        else:
            merged["stop_token_ids"] = (self.model.ids.codec_eos,)
        # the other codec specials: the model's SuppressTokens processor
        merged["penalty_includes_prompt"] = False

    def abort(self, rid: str) -> None:
        self._streams.pop(rid, None)
        super().abort(rid)

    def _fail(self, rid: str, exc: InvalidRequest) -> None:
        self.abort(rid)
        self._errors.append(Emit(rid, error=str(exc), error_kind=exc.kind))

    # ---- stepping -------------------------------------------------------------------
    def emits_for(self, out: StepOutput) -> list[Emit]:
        emits = []
        codes = (out.extra or {}).get("codes")
        if codes is not None:
            frame = np.asarray(codes, dtype=np.int64).reshape(1, -1)
            emits.append(Emit(out.rid, self.codes_port, {"codes": frame}))
        if out.finished:
            self._streams.pop(out.rid, None)
            emits.append(Emit(out.rid, finish=True))
        return emits

    def backlog(self) -> int:
        waiting = len(self.engine.scheduler.waiting) if self.engine else 0
        return waiting + sum(not s.submitted for s in self._streams.values())

    def stats(self) -> dict[str, Any]:
        graphs = getattr(self.model, "predictor_graphs", None)
        extra = {f"predictor_{k}": v for k, v in graphs.stats().items()} if graphs is not None else {}
        return {**super().stats(), "streams": len(self._streams), **extra}
