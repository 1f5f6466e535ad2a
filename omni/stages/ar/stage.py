"""`ARStage`: the AR engine behind the pure `Stage` interface.

Request flow: `open` keeps the request's params; `feed` collects its prompt (`token_ids`
chunks extend it, any other key is kept as an extra model input); `close_input` submits
it to the engine (a request whose params already hold `prompt_token_ids` and that has
no inbound edge is submitted at `open`). Each `step` emits, per request:

- port `hidden` (when tapping): {"tap_start": first position, "token_ids": [n ids],
  "prompt_len": P, "layer_<i>": [n, H] tensor...}, one row per processed token. The
  prompt's rows come as one chunk (buffered across prefill chunks), then one per token.
- port `text`: {"token_ids": [new ids], "finish_reason"?: "stop" | "length", **extra}
- then `Emit(rid, finish=True)` when the request is done.

Model families subclass it and override `build_model` (and, if they need to, `submit`).

Args: `ARArgs` (omni/stages/ar/args.py: the EngineConfig fields and the stage's own; a subclass
names its own class in `Args`); `args.backend` picks the engine:
"builtin" (default, `AREngine`) or "sglang" (`omni.stages.ar.sglang_backend`: SGLang's engine in the
stage process; where sglang is not importable, set-up fails with `BackendUnavailable`). Sampling:
`args.default_sampling` under the request's `params["sampling"][<stage name>]` (omni/stages/sampling.py).
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from omni.kernel.errors import GraphError, InvalidRequest
from omni.kernel.stage import Emit, Stage, StageContext
from omni.stages.ar.args import BACKENDS, ARArgs
from omni.stages.ar.config import EngineConfig
from omni.stages.args import coerce_args
from omni.stages.ar.engine import AREngine, StepOutput
from omni.stages.ar.model_api import ARModel
from omni.stages.ar.sequence import SamplingParams
from omni.stages.batched_emits import batch_chunks
from omni.stages.gpu_memory import gpu_memory
from omni.stages.sampling import merged_sampling
from omni.stages.step_profiler import StepProfiler
from omni.stages.threads import pin_torch_threads

log = logging.getLogger("omni.ar.stage")


@dataclass
class _Pending:
    params: dict[str, Any]
    token_ids: list[int] = field(default_factory=list)
    inputs: dict[str, Any] = field(default_factory=dict)


def copy_input(value: Any) -> Any:
    """Arrays handed to `feed` are only valid during the call."""
    if hasattr(value, "clone"):
        return value.clone()
    if hasattr(value, "copy"):
        return value.copy()
    return value


class ARStage(Stage):
    text_port = "text"
    hidden_port = "hidden"
    batched_ports = ("hidden",)  # a step's one-row chunks on these go as one message (batched_emits.py)
    Args: type[ARArgs] = ARArgs
    # The SGLang model class ("package:Class") serving this stage's checkpoint with tap layers'
    # hidden states (backend="sglang" with taps); the family names it, the backend names none.
    sglang_taps_model: str | None = None

    def __init__(self, ctx: StageContext) -> None:
        ctx.args = coerce_args(self.Args, ctx.args, ctx.name)
        super().__init__(ctx)
        self.engine: AREngine | None = None
        self._pending: dict[str, _Pending] = {}
        self._errors: list[Emit] = []
        self._prompt_taps: dict[str, list[StepOutput]] = {}  # prompt rows not yet emitted
        self.profiler = StepProfiler(f"{ctx.name}.{ctx.replica}")

    # ---- set-up ---------------------------------------------------------------------
    def build_model(self) -> ARModel:
        """The model adapter. Default: `args.model_factory`, a callable or "module:attr" called
        with the stage context."""
        factory = self.ctx.args.model_factory
        if factory is None:
            raise NotImplementedError(f"{type(self).__name__} needs build_model() or args.model_factory")
        if isinstance(factory, str):
            module, _, attr = factory.partition(":")
            factory = getattr(importlib.import_module(module), attr)
        return factory(self.ctx)

    def sglang_model_path(self) -> str:
        """The checkpoint SGLang loads (backend "sglang"): `sglang_model_path`, else `model_dir`."""
        path = self.ctx.args.sglang_model_path or self.ctx.args.model_dir
        if not path:
            raise InvalidRequest(f"stage {self.ctx.name!r}: the sglang backend needs args 'model_dir' or 'sglang_model_path'")
        return str(path)

    def engine_config(self) -> EngineConfig:
        """The engine runs on the stage's device; a context built in-process without one (the
        StageContext default, "cpu") takes the args' `device` instead."""
        ctx_device, args_device = self.ctx.device, self.ctx.args.device
        return self.ctx.args.engine_config(device=args_device if ctx_device == "cpu" else ctx_device)

    def setup(self) -> None:
        args = self.ctx.args
        pin_torch_threads(args.threads)
        backend = args.backend
        if backend not in BACKENDS:
            raise GraphError(f"stage {self.ctx.name!r}: args.backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "sglang":
            from omni.stages.ar.sglang_backend import sglang_engine_for

            self.engine = sglang_engine_for(self.ctx.args, self.engine_config(), self.sglang_model_path,
                                            self.sglang_taps_model)
            self.engine_ready()
            return
        self.engine = AREngine(self.build_model(), self.engine_config())
        self.engine_ready()
        self.engine.warmup(self.tap_variants())  # every decode graph before the stage says it is ready
        self.warm_up()

    def engine_ready(self) -> None:
        """The engine exists: a subclass finishes its own set-up here (before the warm-up runs)."""

    # ---- start-up warm-up -------------------------------------------------------------
    # prefill lengths whose token-expert pair counts fall in every power-of-two class of the MoE
    # layout kernel and every tile bucket of the fused MoE (moe_triton), for top-k from 4 to 8
    WARM_PROMPT_LENGTHS = (2, 5, 9, 17, 33, 65, 129, 257, 700, 1500)

    def warm_requests(self) -> list[tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]]:
        """Requests (params, chunks fed before `close_input`) run once at start-up on a GPU, so
        that every eager kernel (prefill shapes, Triton specialisations) is compiled before the
        stage says it is ready. Default: none; model stages override it."""
        return []

    def warm_lengths(self) -> list[int]:
        cfg = self.engine.config
        cap = min(cfg.max_model_len - 8, cfg.max_num_batched_tokens)
        return sorted({max(1, min(n, cap)) for n in self.WARM_PROMPT_LENGTHS})

    def warm_up(self, force: bool = False) -> int:
        """Run `warm_requests` to their end (on CUDA, or with `force`); returns how many ran."""
        if not force and not str(self.engine.config.device).startswith("cuda"):
            return 0
        requests = self.warm_requests()
        if not requests:
            return 0
        t0 = time.monotonic()
        # prefix caching off meanwhile: warm prompts share prefixes, and a hit would skip the very
        # prefill shapes they are there to compile (nor should they leave blocks in the cache)
        blocks = getattr(getattr(self.engine, "scheduler", None), "blocks", None)
        caching = getattr(blocks, "caching", False)
        if caching:
            blocks.caching = False
        try:
            self._run_warm(requests)
        finally:
            if caching:
                blocks.caching = True
        log.info("stage %s: %d warm-up requests in %.1f s", self.ctx.name, len(requests), time.monotonic() - t0)
        return len(requests)

    def _run_warm(self, requests: list) -> None:
        for i, (params, chunks) in enumerate(requests):
            rid = f"__warm-{i}"
            self.open(rid, params)
            for port, data in chunks:
                self.feed(rid, port, data)
            self.close_input(rid)
            for _ in range(10_000):
                emits = self.step()
                failed = [e.error for e in emits if e.rid == rid and e.error is not None]
                if failed:
                    raise RuntimeError(f"stage {self.ctx.name}: warm-up request failed: {failed[0]}")
                if any(e.rid == rid and e.finish for e in emits):
                    break
            self.abort(rid)

    def tap_variants(self) -> list[tuple[int, ...]]:
        """The tap sets this stage's decode steps ask for: always its taps when it feeds a hidden
        port, none otherwise (plus its taps if a request may ask with `return_hidden`)."""
        taps = self.engine.config.tap_layers
        if self.hidden_port in self.ctx.out_ports:
            return [taps]
        return list(dict.fromkeys([(), taps]))

    def teardown(self) -> None:
        # the SGLang engine, and a tensor-parallel model, own processes
        for owner in (self.engine, getattr(self.engine, "model", None)):
            shutdown = getattr(owner, "shutdown", None)
            if shutdown is not None:
                shutdown()

    # ---- requests -------------------------------------------------------------------
    def open(self, rid: str, params: dict[str, Any]) -> None:
        self._pending[rid] = _Pending(dict(params))
        if "prompt_token_ids" in params and not self.ctx.in_ports:
            self._submit(rid)

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        pending = self._pending.get(rid)
        if pending is None:
            return  # aborted, or already submitted: a subclass handles streaming input
        for key, value in data.items():
            if key == "token_ids":
                pending.token_ids.extend(int(t) for t in value)
            else:
                pending.inputs[key] = copy_input(value)

    def close_input(self, rid: str) -> None:
        if rid in self._pending:
            self._submit(rid)

    def abort(self, rid: str) -> None:
        self._pending.pop(rid, None)
        self._prompt_taps.pop(rid, None)
        if self.engine is not None:
            self.engine.abort(rid)

    def _submit(self, rid: str) -> None:
        pending = self._pending.pop(rid)
        try:
            self.submit(rid, pending.params, pending.token_ids, pending.inputs)
        except InvalidRequest as exc:
            self._errors.append(Emit(rid, error=str(exc), error_kind=exc.kind))

    def submit(self, rid: str, params: dict[str, Any], token_ids: list[int], inputs: dict[str, Any]) -> None:
        """Hand a complete request to the engine; raise InvalidRequest to fail it."""
        prompt = list(params.get("prompt_token_ids") or []) + token_ids
        self.engine.add_request(
            rid,
            prompt,
            self.sampling_params(params),
            inputs=inputs,
            return_hidden=self.wants_hidden(params),
        )

    def sampling_params(self, params: dict[str, Any]) -> SamplingParams:
        return merged_sampling(self.ctx.args.default_sampling, params, self.ctx.name)

    def wants_hidden(self, params: dict[str, Any]) -> bool:
        return bool(params.get("return_hidden")) or self.hidden_port in self.ctx.out_ports

    # ---- stepping -------------------------------------------------------------------
    def step(self) -> list[Emit]:
        emits, self._errors = self._errors, []
        with self.profiler.step():
            outputs = self.engine.step()
        for out in outputs:
            emits.extend(self.emits_for(out))
        for port in self.batched_ports:
            emits = batch_chunks(emits, port)
        return emits

    def emits_for(self, out: StepOutput) -> list[Emit]:
        if out.error is not None:
            self._prompt_taps.pop(out.rid, None)
            return [Emit(out.rid, error=out.error, error_kind=out.error_kind or "stage_failed")]
        emits = []
        if out.taps and self._port_on(self.hidden_port):
            hidden = self._hidden_chunk(out)
            if hidden is not None:
                emits.append(Emit(out.rid, self.hidden_port, hidden))
        if out.new_token_ids or out.finished:
            data = {"token_ids": list(out.new_token_ids)}
            if out.finish_reason:
                data["finish_reason"] = out.finish_reason
            if out.extra:
                data.update(out.extra)
            if out.logprobs:
                data["logprobs"] = [[t, lp, [list(a) for a in top]] for t, lp, top in out.logprobs]
            emits.append(Emit(out.rid, self.text_port, data))
        if out.finished:
            emits.append(Emit(out.rid, finish=True))
        return emits

    def _hidden_chunk(self, out: StepOutput) -> dict[str, Any] | None:
        """The taps as one chunk, or None while the prompt's rows are still arriving."""
        parts = [out]
        if out.tap_start < out.num_prompt_tokens or out.rid in self._prompt_taps:
            parts = self._prompt_taps.setdefault(out.rid, [])
            parts.append(out)
            if out.tap_start + len(out.tap_token_ids) < out.num_prompt_tokens:
                return None
            del self._prompt_taps[out.rid]
        data: dict[str, Any] = {
            "tap_start": parts[0].tap_start,
            "token_ids": [t for p in parts for t in p.tap_token_ids],
            "prompt_len": out.num_prompt_tokens,
        }
        for t in out.taps:
            rows = [p.taps[t] for p in parts]
            # left on the stage's device: a cuda_ipc edge moves it GPU to GPU, the others copy it out
            data[f"layer_{t}"] = (rows[0] if len(rows) == 1 else torch.cat(rows)).detach()
        return data

    def _port_on(self, port: str) -> bool:
        return not self.ctx.out_ports or port in self.ctx.out_ports

    def has_work(self) -> bool:
        return bool(self._errors) or (self.engine is not None and self.engine.has_work())

    def backlog(self) -> int:
        if self.engine is None:
            return len(self._pending)
        waiting = self.engine.num_waiting() if hasattr(self.engine, "num_waiting") else len(self.engine.scheduler.waiting)
        return len(self._pending) + waiting

    def stats(self) -> dict[str, Any]:
        return {**self.engine.stats(), **gpu_memory(self.engine.config.device)} if self.engine else {}
