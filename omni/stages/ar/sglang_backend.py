"""`SGLangEngine`: an AR stage's engine backed by SGLang's offline `Engine` (stage arg `backend="sglang"`).

Same interface as the built-in `AREngine` (add_request / abort / step / has_work / stats /
num_waiting / shutdown), returning the same `StepOutput`s, so `ARStage` does not know which engine
it drives. SGLang's `Engine` runs its scheduler and model runner in child processes and its
tokenizer manager on an asyncio loop in this process; that loop runs on a thread of its own here.
Each request is one streaming `async_generate(input_ids=..., rid=rid, stream=True)`; its chunks
land on a thread-safe queue that `step()` drains (waiting at most `poll_s` while requests are in
flight), so continuous batching is SGLang's own and the actor's compute thread never blocks long.

Mapping:
- sampling: temperature, top_p, top_k (0 -> -1), min_p, repetition / presence / frequency
  penalties, max_tokens -> max_new_tokens (capped by the context left), stop_token_ids, ignore_eos,
  seed -> sampling_seed, min_tokens -> min_new_tokens, logit_bias, suppress_token_ids -> logit_bias -inf. A penalty over output tokens only
  (`penalty_includes_prompt=False`) has no SGLang equivalent: rejected as InvalidRequest.
- abort: `vendor.abort_request` on the loop; SGLang frees the request's KV slots
  in its own pool when its scheduler sees the abort (asynchronously, unlike the built-in engine;
  `kv_usage()` reads SGLang's pool to check).
- taps (`config.tap_layers`, hidden states a downstream stage consumes): the family's taps model
  class (`taps_model`, e.g. a vendor class in omni/vendor/sglang_models) captures the residual stream
  entering each tap layer and SGLang returns
  those rows as the request's hidden states (`return_hidden_states=True`): the prompt's rows with
  the first token, then one row per fed token, as the built-in engine's taps. The rows travel as
  Python lists (SGLang's format, resent whole with each streamed chunk), so taps cost host time
  that grows with the answer's length; a tap of layer `num_layers` (after the last layer) is not
  offered.
- multimodal inputs (encoder embeddings): not mapped; a request with `inputs` is an InvalidRequest.
- errors SGLang raises for one request end that request with an error (`StepOutput.error`).
- `tensor_parallel_size` N > 1: SGLang's `tp_size`, its ranks on the stage's GPU and the N - 1 after it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

from omni.kernel.errors import GraphError, InvalidRequest
from omni.stages.ar.args import ARArgs
from omni.stages.ar.config import EngineConfig
from omni.stages.ar.engine import StepOutput
from omni.stages.ar.sequence import SamplingParams
from omni.vendor import sglang as vendor

FEATURE = "the SGLang backend of AR stages (backend=\"sglang\")"
log = logging.getLogger("omni.ar.sglang")


def sglang_sampling(params: SamplingParams, max_new_tokens: int) -> dict[str, Any]:
    """omni's per-request sampling as SGLang's `sampling_params` dict."""
    if params.repetition_penalty != 1.0 and not params.penalty_includes_prompt:
        raise InvalidRequest("the sglang backend cannot apply a repetition penalty to output tokens only")
    out: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k or -1,
        "min_p": params.min_p,
        "repetition_penalty": params.repetition_penalty,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "max_new_tokens": min(params.max_tokens, max_new_tokens),
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
    }
    if params.min_tokens:
        out["min_new_tokens"] = params.min_tokens
    if params.seed is not None:
        out["sampling_seed"] = params.seed
    bias = {str(t): v for t, v in params.logit_bias}
    bias.update({str(t): -float("inf") for t in params.suppress_token_ids})
    if bias:
        out["logit_bias"] = bias
    return out


class TapsMissing(RuntimeError):
    """SGLang's hidden-state rows do not cover what the taps need."""


def hidden_rows(items: list) -> list[list[float]]:
    """SGLang's per-request hidden states (a list of prefill chunks, each a list of rows, and of
    single decode rows) as one row per position, in order."""
    rows: list[list[float]] = []
    for item in items:
        if not item:
            continue
        if isinstance(item[0], (list, tuple)):
            rows.extend(item)
        else:
            rows.append(item)
    return rows


def split_taps(rows: list[list[float]], tap_layers: tuple[int, ...], hidden_size: int | None = None) -> dict[int, torch.Tensor]:
    """Rows of concat(tap_a, tap_b, ...) (ascending layers, as the taps model packs them) -> {tap: [n, H]}."""
    data = torch.tensor(rows, dtype=torch.float32)
    layers = sorted(tap_layers)
    want = len(layers) * hidden_size if hidden_size else None
    if data.shape[-1] % len(layers) or (want and data.shape[-1] != want):
        raise RuntimeError(f"SGLang returned hidden-state rows of width {data.shape[-1]}, not {len(layers)} taps"
                           + (f" x {hidden_size}" if hidden_size else "") + ": is the taps model class in use?")
    return dict(zip(layers, data.chunk(len(layers), dim=-1)))


def config_hidden_size(model_path: str) -> int | None:
    try:
        return int(json.loads((Path(model_path) / "config.json").read_text())["hidden_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class SGLangEngine:
    """The AR engine interface over `sglang.Engine` (see the module docstring)."""

    def __init__(self, model_path: str, config: EngineConfig, server_args: dict[str, Any] | None = None,
                 poll_s: float = 0.005, taps_model: str | None = None) -> None:
        """`taps_model`: the SGLang model class ("package:Class") that returns the tap layers'
        hidden states; needed when `config.tap_layers` is set."""
        sglang = vendor.require(FEATURE)  # fails here, first, where sglang is not importable
        if config.tap_layers and not taps_model:
            raise GraphError(f"taps {list(config.tap_layers)} on the sglang backend need the family's SGLang "
                             "taps model class (ARStage.sglang_taps_model)")
        self.config = config
        self.poll_s = poll_s
        self.tap_layers = tuple(config.tap_layers)
        self.hidden_size = config_hidden_size(model_path)
        args: dict[str, Any] = {"model_path": model_path, "max_running_requests": config.max_num_seqs,
                                "context_length": config.max_model_len, "skip_tokenizer_init": True,
                                "cuda_graph_max_bs_decode": config.max_num_seqs, "log_level": "error"}
        if config.dtype:
            args["dtype"] = config.dtype
        if str(config.device).startswith("cuda:"):
            args["base_gpu_id"] = int(str(config.device).split(":", 1)[1])
        if not config.enable_prefix_caching:
            args["disable_radix_cache"] = True  # SGLang's own prefix cache (its radix tree)
        args.update(vendor.parallel_server_args(config.tensor_parallel_size))
        if self.tap_layers:
            args.update(vendor.taps_server_args(self.tap_layers, taps_model))
        args.update(server_args or {})
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sglang-loop", daemon=True)
        self._thread.start()
        t0 = time.perf_counter()
        self._sgl = sglang.Engine(**args)  # its scheduler process starts here (tens of seconds on a GPU)
        log.info("sglang engine up in %.1fs (%s)", time.perf_counter() - t0, model_path)
        self._chunks: queue.Queue[tuple[str, dict[str, Any] | None]] = queue.Queue()
        self._live: dict[str, dict[str, Any]] = {}  # rid -> {"prompt", "seen", "items", "rows", "outputs"}
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
        room = self.config.max_model_len - len(prompt)
        if room < 1:
            raise InvalidRequest(f"prompt of {len(prompt)} tokens leaves no room in max_model_len {self.config.max_model_len}")
        params = params or SamplingParams()
        if params.logprobs is not None:  # refused, not answered without them
            raise InvalidRequest("logprobs: the sglang backend does not report them yet (the built-in engine does)")
        sampling = sglang_sampling(params, room)
        if self.config.eos_token_ids and not params.ignore_eos:
            sampling["stop_token_ids"] = sorted(set(sampling["stop_token_ids"]) | set(self.config.eos_token_ids))
        hidden = return_hidden and bool(self.tap_layers)
        state = {"prompt": prompt, "seen": 0, "items": 0, "rows": 0, "outputs": [], "hidden": hidden}
        self._live[rid] = state
        state["task"] = asyncio.run_coroutine_threadsafe(self._stream(rid, prompt, sampling, hidden), self._loop)

    async def _stream(self, rid: str, prompt: list[int], sampling: dict[str, Any], hidden: bool) -> None:
        try:
            gen = await self._sgl.async_generate(input_ids=prompt, sampling_params=sampling, rid=rid,
                                                 stream=True, return_hidden_states=hidden)
            async for chunk in gen:
                self._chunks.put((rid, chunk))
        except Exception as exc:  # SGLang refused or failed this request: end it with the reason
            self._chunks.put((rid, {"error": f"sglang: {type(exc).__name__}: {exc}"}))
        finally:
            self._chunks.put((rid, None))

    def abort(self, rid: str) -> bool:
        """SGLang's scheduler drops the request (and frees its KV) when the abort reaches it."""
        state = self._live.pop(rid, None)
        if state is None:
            return False
        asyncio.run_coroutine_threadsafe(self._abort(rid, state["task"]), self._loop).result(10)
        return True

    async def _abort(self, rid: str, task) -> None:
        vendor.abort_request(self._sgl, rid)
        task.cancel()

    # ---- stepping -----------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        outs: dict[str, StepOutput] = {}
        timeout = self.poll_s if self._live else 0.0
        while True:
            try:
                rid, chunk = self._chunks.get(timeout=timeout) if timeout else self._chunks.get_nowait()
            except queue.Empty:
                break
            timeout = 0.0
            state = self._live.get(rid)
            if state is None or chunk is None:
                continue  # aborted, or the stream's end marker after its finishing chunk
            res = outs.setdefault(rid, StepOutput(rid, num_prompt_tokens=len(state["prompt"])))
            if "error" in chunk:
                res.error, res.finished, res.finish_reason = chunk["error"], True, "error"
            else:
                try:
                    self._apply_chunk(state, chunk, res)
                except TapsMissing as exc:  # end the request with the reason; SGLang stops it
                    res.error, res.finished, res.finish_reason = str(exc), True, "error"
                    asyncio.run_coroutine_threadsafe(self._abort(rid, state["task"]), self._loop).result(10)
            if res.finished:
                del self._live[rid]
        return list(outs.values())

    def _apply_chunk(self, state: dict[str, Any], chunk: dict[str, Any], res: StepOutput) -> None:
        ids = list(chunk.get("output_ids") or [])  # cumulative in a stream (skip_tokenizer_init)
        new = ids[state["seen"]:]
        state["seen"] = len(ids)
        state["outputs"].extend(new)
        res.new_token_ids.extend(new)
        self.num_generated += len(new)
        meta = chunk.get("meta_info") or {}
        if state["hidden"] and meta.get("hidden_states"):
            self._apply_taps(state, meta["hidden_states"], res)
        reason = meta.get("finish_reason")
        if reason:
            res.finished = True
            res.finish_reason = "length" if reason.get("type") == "length" else "stop"

    def _apply_taps(self, state: dict[str, Any], items: list, res: StepOutput) -> None:
        """Rows past those already emitted (SGLang resends the whole list with each chunk)."""
        rows = hidden_rows(items[state["items"]:])
        state["items"] = len(items)
        if not rows:
            return
        start = state["rows"]
        if start == 0 and len(rows) < len(state["prompt"]):
            raise TapsMissing(f"SGLang returned {len(rows)} hidden-state rows for a {len(state['prompt'])}-token "
                              "prompt (a prefix-cache hit computes no rows: is radix caching on?)")
        state["rows"] = start + len(rows)
        taps = split_taps(rows, self.tap_layers, self.hidden_size)
        if res.taps:  # a second chunk in the same step: append
            res.taps = {t: torch.cat([res.taps[t], taps[t]]) for t in taps}
        else:
            res.taps, res.tap_start = taps, start
        prompt, lo, hi = state["prompt"], res.tap_start, state["rows"]  # fed token ids of those positions
        res.tap_token_ids = prompt[lo:hi] + state["outputs"][max(lo - len(prompt), 0):max(hi - len(prompt), 0)]

    # ---- state --------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self._live) or not self._chunks.empty()

    def num_waiting(self) -> int:
        return 0  # SGLang queues inside its scheduler; `kv_usage()` tells, at a round trip

    def kv_usage(self, timeout: float = 10.0) -> dict[str, int]:
        """SGLang's own view of its pool: running and waiting requests, KV tokens in use."""
        fut = asyncio.run_coroutine_threadsafe(vendor.pool_usage(self._sgl), self._loop)
        return fut.result(timeout)

    def stats(self) -> dict[str, Any]:
        return {"backend": "sglang", "running": len(self._live), "num_generated_tokens": self.num_generated}

    def shutdown(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._cancel_streams(), self._loop).result(10)
            self._sgl.shutdown()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    async def _cancel_streams(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def sglang_engine_for(args: ARArgs, config: EngineConfig, model_path: Callable[[], str],
                      taps_model: str | None = None) -> SGLangEngine:
    """Build from a stage's args (sglang checked first, then `model_path()` asked: it may export a
    checkpoint); `taps_model` as in `SGLangEngine`. `sglang_args` go to `sglang.Engine` (e.g. {"attention_backend": "triton"});
    `load_format="random"` becomes SGLang's "dummy"; `sglang_mem_fraction` (default 0.7) leaves
    room for the other stages on the GPU."""
    vendor.require(FEATURE)
    server_args: dict[str, Any] = {"mem_fraction_static": args.sglang_mem_fraction}
    if args.load_format == "random":
        server_args["load_format"] = "dummy"
    server_args.update(args.sglang_args)
    return SGLangEngine(model_path(), config, server_args, taps_model=taps_model)
