"""`SGLangEngine`: an AR stage's engine backed by SGLang's offline `Engine` (stage arg `backend="sglang"`).

STATUS: a design, NOT RUN. This machine has no usable sglang (its import fails on missing
dependencies) and no GPU, so no line below the `require` call in `__init__` has ever executed;
nothing here is claimed to work. What IS exercised on CPU: choosing `backend="sglang"` where
sglang is not importable fails at stage set-up with `BackendUnavailable` (the kernel reports a
`StageStartError` naming the stage). The GPU tests the issue asks for (greedy tokens vs
transformers under teacher forcing, taps vs the built-in engine, KV freed on abort) are not written.

Shape: same interface as the built-in `AREngine` (add_request / abort / step / has_work / stats /
num_waiting), returning the same `StepOutput`s, so `ARStage` does not know which engine it drives.
SGLang's `Engine` runs its scheduler and model runner in a child process and its tokenizer manager
on an asyncio loop in this process; that loop runs on a thread of its own here. Each request is one
streaming `async_generate(input_ids=..., rid=rid, stream=True)`; its chunks land on a thread-safe
queue that `step()` drains (waiting at most `poll_s` when requests are in flight), so continuous
batching is SGLang's own and the actor's compute thread never blocks on SGLang for long.

Mapping (to check against sglang 0.5.17 on the GPU):
- sampling: temperature, top_p, top_k (0 -> -1), repetition_penalty, max_tokens -> max_new_tokens,
  stop_token_ids, ignore_eos, seed -> sampling_seed; suppress_token_ids -> logit_bias -inf.
  A penalty over output tokens only (`penalty_includes_prompt=False`) has no SGLang equivalent:
  rejected as InvalidRequest.
- abort: `tokenizer_manager.abort_request(rid)` on the loop; SGLang frees the request's KV slots
  in its own pool when its scheduler sees the abort (asynchronous, unlike the built-in engine).
- taps: SGLang's `return_hidden_states=True` returns the LAST layer's hidden states (prompt rows
  in the first chunk, one row per new token after). The talker needs layer 0 and
  `accept_hidden_layer`; capturing intermediate layers needs a vendor patch of SGLang's
  Qwen3-Omni thinker forward, not written, and even the last layer's rows are not mapped to
  `StepOutput.taps` yet. So a stage with taps (the `speech` variant's thinker) is refused at
  start-up with BackendUnavailable rather than emitting wrong or missing rows.
- multimodal inputs (encoder embeddings from omni's encoder stages): would map to SGLang's
  `precomputed_embedding` items; not written, so a request with `inputs` is an InvalidRequest.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any

from omni.kernel.errors import BackendUnavailable, InvalidRequest
from omni.stages.ar.config import EngineConfig
from omni.stages.ar.engine import StepOutput
from omni.stages.ar.sequence import SamplingParams
from omni.vendor import sglang as vendor

FEATURE = "the SGLang backend of AR stages (backend=\"sglang\")"


def sglang_sampling(params: SamplingParams, max_model_len: int) -> dict[str, Any]:
    """omni's per-request sampling as SGLang's `sampling_params` dict."""
    if params.repetition_penalty != 1.0 and not params.penalty_includes_prompt:
        raise InvalidRequest("the sglang backend cannot apply a repetition penalty to output tokens only")
    out: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k or -1,
        "repetition_penalty": params.repetition_penalty,
        "max_new_tokens": min(params.max_tokens, max_model_len),
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
    }
    if params.seed is not None:
        out["sampling_seed"] = params.seed
    if params.suppress_token_ids:
        out["logit_bias"] = {str(t): -float("inf") for t in params.suppress_token_ids}
    return out


class SGLangEngine:
    """The AR engine interface over `sglang.Engine` (see the module docstring: not run yet)."""

    def __init__(self, model_path: str, config: EngineConfig, server_args: dict[str, Any] | None = None,
                 poll_s: float = 0.005) -> None:
        sglang = vendor.require(FEATURE)  # fails here, first, where sglang is not importable
        if config.tap_layers:
            raise BackendUnavailable(
                f"{FEATURE} has no hidden-state taps yet (asked for layers {list(config.tap_layers)}): "
                "SGLang returns only the last layer's, and mapping them is not written")
        self.config = config
        self.poll_s = poll_s
        args = {"model_path": model_path, "max_running_requests": config.max_num_seqs,
                "context_length": config.max_model_len, "skip_tokenizer_init": True, **(server_args or {})}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sglang-loop", daemon=True)
        self._thread.start()
        self._sgl = sglang.Engine(**args)  # its scheduler process starts here (tens of seconds on a GPU)
        self._chunks: queue.Queue[tuple[str, dict[str, Any] | None]] = queue.Queue()
        self._live: dict[str, dict[str, Any]] = {}  # rid -> {"prompt_len", "seen", "task"}
        self.num_generated = 0

    # ---- requests -----------------------------------------------------------------
    def add_request(self, rid: str, prompt_token_ids: list[int], params: SamplingParams | None = None, *,
                    inputs: dict[str, Any] | None = None, return_hidden: bool = False) -> None:
        if rid in self._live:
            raise InvalidRequest(f"request {rid!r} is already in the engine")
        if inputs:
            raise InvalidRequest(f"the sglang backend takes token prompts only for now, got inputs {sorted(inputs)}")
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            raise InvalidRequest("empty prompt")
        sampling = sglang_sampling(params or SamplingParams(), self.config.max_model_len)
        if self.config.eos_token_ids and not (params and params.ignore_eos):
            sampling["stop_token_ids"] = sorted(set(sampling["stop_token_ids"]) | set(self.config.eos_token_ids))
        hidden = return_hidden and bool(self.config.tap_layers)
        task = asyncio.run_coroutine_threadsafe(self._stream(rid, prompt, sampling, hidden), self._loop)
        self._live[rid] = {"prompt_len": len(prompt), "seen": 0, "task": task}

    async def _stream(self, rid: str, prompt: list[int], sampling: dict[str, Any], hidden: bool) -> None:
        try:
            gen = await self._sgl.async_generate(input_ids=prompt, sampling_params=sampling, rid=rid,
                                                 stream=True, return_hidden_states=hidden)
            async for chunk in gen:
                self._chunks.put((rid, chunk))
        finally:
            self._chunks.put((rid, None))

    def abort(self, rid: str) -> bool:
        state = self._live.pop(rid, None)
        if state is None:
            return False
        self._loop.call_soon_threadsafe(self._sgl.tokenizer_manager.abort_request, rid)
        return True

    # ---- stepping -----------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        outs: dict[str, StepOutput] = {}
        timeout = self.poll_s if self._live else 0.0
        while True:
            try:
                rid, chunk = self._chunks.get(timeout=timeout)
            except queue.Empty:
                break
            timeout = 0.0
            state = self._live.get(rid)
            if state is None or chunk is None:
                continue  # aborted, or the stream's end marker after its finishing chunk
            res = outs.setdefault(rid, StepOutput(rid, num_prompt_tokens=state["prompt_len"]))
            self._apply_chunk(state, chunk, res)
            if res.finished:
                del self._live[rid]
        return list(outs.values())

    def _apply_chunk(self, state: dict[str, Any], chunk: dict[str, Any], res: StepOutput) -> None:
        ids = list(chunk.get("output_ids") or [])  # cumulative in a stream (skip_tokenizer_init)
        new = ids[state["seen"]:]
        state["seen"] = len(ids)
        res.new_token_ids.extend(new)
        self.num_generated += len(new)
        meta = chunk.get("meta_info") or {}
        reason = meta.get("finish_reason")
        if reason:
            res.finished = True
            res.finish_reason = "length" if reason.get("type") == "length" else "stop"
        # taps from meta["hidden_states"] (last layer only, see the docstring): not mapped yet

    # ---- state --------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self._live) or not self._chunks.empty()

    def num_waiting(self) -> int:
        return 0  # SGLang queues inside its scheduler; get_server_info() would tell, at a cost

    def stats(self) -> dict[str, Any]:
        return {"backend": "sglang", "running": len(self._live), "num_generated_tokens": self.num_generated}

    def shutdown(self) -> None:
        self._sgl.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)


def sglang_engine_for(args: dict[str, Any], config: EngineConfig) -> SGLangEngine:
    """Build from a stage's args: `model_dir` (or `sglang_model_path`) and `sglang_args`, passed to
    `sglang.Engine` (e.g. {"attention_backend": "triton"}); `load_format="random"` becomes "dummy"."""
    vendor.require(FEATURE)
    path = args.get("sglang_model_path") or args.get("model_dir")
    if not path:
        raise InvalidRequest(f"{FEATURE} needs args 'model_dir' or 'sglang_model_path'")
    server_args = dict(args.get("sglang_args") or {})
    if args.get("load_format") == "random":
        server_args.setdefault("load_format", "dummy")
    return SGLangEngine(str(path), config, server_args)
