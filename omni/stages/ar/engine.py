"""The AR engine: one `step()` = schedule -> run the model -> sample -> postprocess.

With lookahead (lookahead.py) a decode step's successor is launched before its ids reach the
host, so `step` returns step N's outputs while step N+1 runs.

Pure and in-process (no threads, no sockets): `ARStage` drives it from the actor's compute
thread. `step` returns what happened; it never sends anything.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from omni.kernel.errors import InvalidRequest
from omni.layers.fused_linear import fuse_model_projections
from omni.layers.paged_attention import allocate_kv_cache
from omni.stages.ar.config import EngineConfig
from omni.stages.ar.cuda_graphs import DecodeGraphs
from omni.stages.ar.logprobs import gather_logprobs
from omni.stages.ar.host_copy import HostCopy
from omni.stages.ar.lookahead import model_looks_ahead, plan_lookahead
from omni.stages.ar.model_api import AfterSample, ARModel, PendingSample
from omni.stages.ar.runner import ModelRunner
from omni.stages.ar.sampler import Sampler
from omni.stages.ar.scheduler import Scheduler, SchedulerOutput
from omni.stages.ar.sequence import FinishReason, SamplingParams, Sequence
from omni.stages.ar.tap_store import TapStore
from omni.stages.gpu_clock import GpuClock


_gen_ids = itertools.count()
log = logging.getLogger("omni.ar.engine")


def decode_kernel(config: EngineConfig, kv_cache: torch.Tensor):
    """The paged decode-attention kernel the config asks for, or None (torch SDPA). "auto" takes the
    kernel where it runs (a CUDA cache and triton), quietly; "triton" warns where it cannot."""
    backend = config.attention_backend
    if backend == "torch":
        return None
    from omni.layers.triton_attention import triton_decode_kernel, triton_decode_usable

    if backend == "auto" and not triton_decode_usable(kv_cache):
        return None
    return triton_decode_kernel(kv_cache)


@dataclass
class StepOutput:
    """What one step did for one request."""

    rid: str
    new_token_ids: list[int] = field(default_factory=list)
    taps: dict[int, torch.Tensor] = field(default_factory=dict)  # tap -> [n, H], positions tap_start...
    tap_start: int = 0  # position of the first row of `taps`
    tap_token_ids: list[int] = field(default_factory=list)  # token id at each row of `taps`
    num_prompt_tokens: int = 0
    finished: bool = False
    finish_reason: str | None = None
    extra: dict[str, Any] | None = None  # from ARModel.after_sample
    error: str | None = None  # the engine failed this request (non-finite logits, an SGLang-side error); it is over
    error_kind: str | None = None  # omni.kernel.errors kind (None: a stage failure)
    logprobs: list | None = None  # per new token, when the request asked (logprobs.Entry)


@dataclass
class _Sampled:
    """What one step sampled: the spans that took a token, and per span its id, extras and log-probs."""

    spans: list
    token_ids: list[int] = field(default_factory=list)
    extras: list[dict] | None = None
    logprobs: list | None = None
    pending: PendingSample | None = None  # the ids' copy to the host, still in flight
    tokens: Any = None  # the ids on the device ([n]; -1: a failed row), a lookahead step's input ids
    ahead: bool = False  # a lookahead step was planned on these: each sequence holds a placeholder for its id

    def resolve(self) -> None:
        """Wait for the ids (and the model's extras), if they are still on their way."""
        if self.pending is not None:
            done, self.pending = self.pending.resolve(), None
            self.extras, self.token_ids = done.extras, done.token_ids


@dataclass
class _Launched:
    """A step whose device work is queued; its host part (`_postprocess`) comes after."""

    batch: Any
    out: Any
    taps: tuple[int, ...]
    sampled: _Sampled


def _ids_on_their_way(tokens: torch.Tensor, extras: list[dict] | None) -> PendingSample:
    copy = HostCopy(tokens)
    return PendingSample(lambda: AfterSample(extras, copy.wait().tolist()))


class AREngine:
    def __init__(self, model: ARModel, config: EngineConfig) -> None:
        if isinstance(model, torch.nn.Module):  # serving never trains: no autograd history anywhere (a tap
            model.requires_grad_(False)  # buffer written from embeddings that required grad grew a chain forever)
            fused = fuse_model_projections(model)  # on CUDA: q/k/v and gate/up as one GEMM each
            if fused:
                log.info("%s: %d modules' projections fused", type(model).__name__, fused)
        self.model = model
        self.config = config
        spec = model.kv_cache_spec()
        dtype = getattr(torch, config.dtype) if config.dtype else spec.dtype
        for tap in config.tap_layers:
            if not 0 <= tap <= spec.num_layers:
                raise InvalidRequest(f"tap layer {tap} outside [0, {spec.num_layers}]")
        graphs = config.graphs_on and getattr(model, "supports_cuda_graphs", False)
        if config.cuda_graphs and not graphs:
            log.warning("%s does not support CUDA graphs: decode runs eagerly", type(model).__name__)
        self.kv_cache = allocate_kv_cache(  # with graphs, one scratch block past the manager's for padding rows
            spec.num_layers, config.num_blocks + int(graphs), config.block_size, spec.num_kv_heads, spec.head_dim,
            dtype, config.device,
        )
        self.scheduler = Scheduler(config, ready=model.input_ready, prefix_key=model.prefix_key)
        # taps of prefix-cached positions (tap_store.py)
        self.tap_store = TapStore(config.num_blocks * config.block_size, config.block_size, config.device) \
            if config.enable_prefix_caching and config.tap_layers else None
        if spec.vocab_size < 1:
            raise InvalidRequest(f"{type(model).__name__}.kv_cache_spec() must give vocab_size (the logits' width)")
        self.sampler = Sampler(spec.vocab_size, config.max_num_seqs, config.device, model.logits_processors())
        kernel = decode_kernel(config, self.kv_cache)
        runner_graphs = None
        if graphs:
            runner_graphs = DecodeGraphs(model, self.kv_cache, config.block_size, config.max_model_len,
                                         config.cuda_graph_max_batch or config.max_num_seqs, config.num_blocks,
                                         config.device, kernel, self.sampler)
        self.runner = ModelRunner(model, self.kv_cache, config.block_size, config.device, runner_graphs, kernel)
        # lookahead.py; the class's own flag (a wrapper such as the TP proxy forwards attributes)
        self.lookahead = bool(graphs and config.lookahead_on and model_looks_ahead(type(model)))
        self._ahead: _Launched | None = None  # the step launched ahead of the last one's results
        self.seqs: dict[str, Sequence] = {}
        self.eos = frozenset(config.eos_token_ids)
        self.num_steps = 0
        self.num_generated = 0
        self.num_computed = 0  # tokens run through the model (prefix-cache hits are not)
        self.num_lookahead_steps = 0
        self.gpu_clock = GpuClock(config.device)  # the GPU's span of each step's forward and sampling

    def warmup(self, tap_variants: list[tuple[int, ...]] | None = None) -> int:
        """Capture every decode graph serving can hit (on CUDA, with `cuda_graphs`), so that no
        request waits on a capture; returns how many. `tap_variants`: the tap sets steps will ask
        for (default: none and the config's)."""
        graphs = self.runner.graphs
        if graphs is None or not graphs.capture:
            return 0
        form = self.model.decode_form
        if form is None:
            log.warning("%s declares no decode_form: decode graphs are captured on first use", type(self.model).__name__)
            return 0
        variants = tap_variants if tap_variants is not None else list(dict.fromkeys([(), self.config.tap_layers]))
        total = len(graphs.keys(form, variants))
        log.info("capturing %d decode graphs (batch buckets %s, taps %s)", total, graphs.sizes, variants)
        step = max(1, total // 10)

        def progress(done: int, total: int) -> None:
            if done % step == 0 or done == total:
                log.info("decode graphs: %d/%d captured (%.1f s)", done, total, graphs.capture_seconds)

        n = graphs.capture_all(form, variants, progress)
        log.info("decode graphs: %d captured in %.1f s", n, graphs.capture_seconds)
        return n

    # ---- requests -----------------------------------------------------------------
    def add_request(
        self,
        rid: str,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        *,
        inputs: dict[str, Any] | None = None,
        return_hidden: bool = False,
    ) -> Sequence:
        """Queue a request; `inputs` go to `ARModel.prepare` (e.g. multimodal embeddings)."""
        if rid in self.seqs:
            raise InvalidRequest(f"request {rid!r} is already in the engine")
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            raise InvalidRequest("empty prompt")
        if len(prompt) > self.config.max_model_len:
            raise InvalidRequest(f"prompt of {len(prompt)} tokens exceeds max_model_len {self.config.max_model_len}")
        params = params or SamplingParams()
        vocab = self.sampler.vocab_size
        bad = [t for t, _ in params.logit_bias if not 0 <= t < vocab]
        if bad:
            raise InvalidRequest(f"logit_bias names token ids outside the vocabulary of {vocab}: {bad[:8]}")
        seq = Sequence(rid, prompt, params, return_hidden=return_hidden)
        self.model.prepare(seq, inputs or {})
        self.seqs[rid] = seq
        self.scheduler.add(seq)
        return seq

    def abort(self, rid: str) -> bool:
        """Drop a request now; its KV blocks are free when this returns."""
        seq = self.seqs.pop(rid, None)
        if seq is None:
            return False
        self._finish(seq, FinishReason.ABORT)
        return True

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        self.scheduler.finish(seq, reason)
        self.sampler.release(seq)
        self.model.release(seq)

    # ---- stepping: schedule -> run -> postprocess ----------------------------------
    def step(self) -> list[StepOutput]:
        """One forward over what the scheduler picked (or the step launched ahead); an output per
        sequence that took part."""
        launched, self._ahead = self._ahead, None
        if launched is None:
            sched = self._schedule()
            if sched is None:
                return []
            launched = self._launch(sched)
        if self.lookahead:
            self._ahead = self._launch_ahead(launched)
        launched.sampled.resolve()  # the step's one host sync
        return self._postprocess(launched.batch, launched.out, launched.taps, launched.sampled)

    def _launch(self, sched: SchedulerOutput, ids: torch.Tensor | None = None) -> _Launched:
        batch, out, taps = self._run(sched, ids)
        return _Launched(batch, out, taps, self._sample(batch, out))

    def _launch_ahead(self, launched: _Launched) -> _Launched | None:
        """Step N+1 of `launched`'s decoding sequences, queued before step N's ids are read (lookahead.py)."""
        sampled = launched.sampled
        if sampled.pending is None or len(sampled.spans) != len(launched.batch.spans) \
                or any(s.num_tokens != 1 for s in sampled.spans):
            return None
        graphs = self.runner.graphs
        if graphs.disabled is not None or len(sampled.spans) > graphs.max_batch:
            return None
        live = [s.seq for s in sampled.spans if not s.seq.is_finished]  # the step before may have ended some
        items = plan_lookahead(self.scheduler, self.model, live, self.config.max_model_len)
        if items is None:
            return None
        sampled.ahead = True
        self.num_lookahead_steps += 1
        if launched.taps:  # the next replay rewrites the graph's output buffers before these are read
            launched.out = replace(launched.out, taps={t: v.clone() for t, v in launched.out.taps.items()})
        ids = sampled.tokens
        if len(live) < len(sampled.spans):
            ids = ids[torch.tensor([i for i, s in enumerate(sampled.spans) if not s.seq.is_finished], device=ids.device)]
        return self._launch(SchedulerOutput(items), ids)

    def _schedule(self) -> SchedulerOutput | None:
        """The step's sequences (None: nothing to run); preempted ones give their sampler slot back
        (rebuilt from the host state when admitted again), the sampling ones hold one."""
        sched = self.scheduler.schedule()
        for seq in sched.preempted:
            self.sampler.release(seq)
        if not sched.scheduled:
            return None
        for item in sched.scheduled:
            if item.samples:
                self.sampler.assign(item.seq)
        return sched

    def _run(self, sched: SchedulerOutput, ids: torch.Tensor | None = None) -> tuple[Any, Any, tuple[int, ...]]:
        """The forward pass: (batch, its output, the tap layers it returned); `ids`: the input ids
        on the device (a lookahead step's, sampled by the step before)."""
        taps = self.config.tap_layers if any(s.seq.return_hidden for s in sched.scheduled) else ()
        batch = self.runner.prepare(sched.scheduled, taps)
        if ids is not None:
            self.runner.feed_ids(batch, ids)
        self.gpu_clock.start()
        out = self.runner.run(batch)
        self.num_steps += 1
        self.num_computed += sched.num_tokens
        if taps and self.tap_store is not None:
            self.tap_store.write([s for s in batch.spans if s.seq.return_hidden], {t: out.taps[t] for t in taps})
        return batch, out, taps

    def _sample(self, batch: Any, out: Any) -> _Sampled:
        """A token for every span that reached its sequence's end (the model's extras, log-probs)."""
        sampled = _Sampled([span for span in batch.spans if span.end == span.seq.num_tokens])
        if sampled.spans:
            rows = [s.row + s.num_tokens - 1 for s in sampled.spans]
            if rows[-1] == len(rows) - 1:  # rows 0..n-1 (every decode step): no gather
                hidden = out.hidden[: len(rows)]
            else:
                hidden = out.hidden[torch.tensor(rows, device=out.hidden.device)]
            seqs = [s.seq for s in sampled.spans]
            tokens, logits = out.tokens, None
            if tokens is None:  # sampled here unless the decode graph already did
                logits = self.runner.logits(hidden)
                tokens = self.sampler.sample(logits, self.sampler.slots_of(seqs), self.sampler.mode_for(seqs), seqs)
            extras = self.model.after_sample(seqs, tokens, hidden)
            self.gpu_clock.stop()
            sampled.tokens = tokens
            wants_logprobs = any(s.params.logprobs is not None for s in seqs)
            if isinstance(extras, PendingSample):  # the model's copy is on its way: `resolve` waits
                sampled.pending = extras
                if wants_logprobs:
                    sampled.resolve()  # log-probs read this step's logits now, before another step
            elif isinstance(extras, AfterSample):  # the model's copy brought the ids to the host already
                sampled.extras, sampled.token_ids = extras.extras, extras.token_ids
            elif self.lookahead and not wants_logprobs:  # the ids' copy starts now, `resolve` waits for it
                sampled.pending = _ids_on_their_way(tokens, extras)
            else:
                sampled.extras, sampled.token_ids = extras, tokens.tolist()  # the step's one host sync
            if sampled.pending is None:
                sampled.logprobs = self._logprobs(seqs, hidden, logits, sampled.token_ids)
        self.gpu_clock.stop()  # a step that samples nothing (a prefill chunk) ends its pair here
        return sampled

    def _postprocess(self, batch: Any, out: Any, taps: tuple[int, ...], sampled: _Sampled) -> list[StepOutput]:
        """Advance every span's sequence (its taps), then give each sampled one its token."""
        results: dict[str, StepOutput] = {}
        for span in batch.spans:
            if not span.seq.is_finished:  # ended (or aborted) while this step ran ahead of the last one's results
                results[span.seq.rid] = self._advance(span, out, taps)
        for i, span in enumerate(sampled.spans):
            res = results.get(span.seq.rid)
            if res is None:
                continue
            if sampled.token_ids[i] < 0:
                self._abort_nonfinite(span.seq, res)
                continue
            res.new_token_ids = [sampled.token_ids[i]]
            if sampled.logprobs is not None and sampled.logprobs[i] is not None:
                res.logprobs = [sampled.logprobs[i]]
            if sampled.extras is not None:
                res.extra = sampled.extras[i]
            self._append_token(span.seq, sampled.token_ids[i], res, over_placeholder=sampled.ahead)
        return list(results.values())

    def _advance(self, span: Any, out: Any, taps: tuple[int, ...]) -> StepOutput:
        """The span's tokens are computed (their blocks cacheable); its output, with the taps of
        positions not yet returned."""
        seq = span.seq
        seq.num_computed_tokens = span.end
        self.scheduler.blocks.cache_computed(seq)
        res = StepOutput(seq.rid, num_prompt_tokens=seq.num_prompt_tokens)
        if seq.return_hidden and taps and span.end > seq.num_tapped_tokens:
            self._taps(span, out, taps, res)
        return res

    def _taps(self, span: Any, out: Any, taps: tuple[int, ...], res: StepOutput) -> None:
        seq = span.seq
        first = max(span.start, seq.num_tapped_tokens)
        lo, hi = span.row + first - span.start, span.row + span.num_tokens
        res.taps = {t: out.taps[t][lo:hi].clone() for t in taps}
        if first > seq.num_tapped_tokens:  # prefix-cached positions: their rows were kept
            cached = self.tap_store.read(seq.block_table, seq.num_tapped_tokens, first, taps)
            res.taps = {t: torch.cat((cached[t], res.taps[t])) for t in taps}
            first = seq.num_tapped_tokens
        res.tap_start = first
        res.tap_token_ids = seq.token_ids(first, span.end)
        seq.num_tapped_tokens = span.end

    def _abort_nonfinite(self, seq: Sequence, res: StepOutput) -> None:
        """The sampler marks a row whose logits were not finite with -1: that request alone fails."""
        self.seqs.pop(seq.rid, None)
        self._finish(seq, FinishReason.ABORT)
        res.taps, res.error_kind = {}, "invalid_request"
        res.error = "the model's output was not finite for this request (NaN or inf logits): check its inputs"

    def _logprobs(self, seqs: list[Sequence], hidden: torch.Tensor, logits: torch.Tensor | None,
                  token_ids: list[int]) -> list | None:
        """Each chosen token's log-prob (and alternatives) for the rows that asked (logprobs.py);
        after a graph-sampled step the logits stayed inside the graph: they are made again here."""
        tops = [s.params.logprobs for s in seqs]
        if all(k is None for k in tops):
            return None
        if logits is None:
            logits = self.runner.logits(hidden)
        return gather_logprobs(logits, [max(t, 0) for t in token_ids], tops)

    def _append_token(self, seq: Sequence, token: int, res: StepOutput, over_placeholder: bool = False) -> None:
        if over_placeholder:  # a lookahead step holds the sequence's newest position for this id
            seq.output_token_ids[-1] = token
        else:
            seq.output_token_ids.append(token)
        self.num_generated += 1
        p = seq.params
        reason = None
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos):
            reason = FinishReason.STOP
        elif len(seq.output_token_ids) >= p.max_tokens or seq.num_tokens > self.config.max_model_len:
            reason = FinishReason.LENGTH
        if reason is not None:
            self._finish(seq, reason)
            self.seqs.pop(seq.rid, None)
            res.finished, res.finish_reason = True, reason.value

    # ---- state --------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def has_work(self) -> bool:
        """True when `step` would compute something now (parked sequences do not count), or a step
        launched ahead waits for its results."""
        return self._ahead is not None or self.scheduler.has_ready()

    def stats(self) -> dict[str, Any]:
        blocks = self.scheduler.blocks
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "free_blocks": blocks.num_free_blocks,
            "total_blocks": blocks.num_blocks,
            "block_size": blocks.block_size,
            "num_preemptions": self.scheduler.num_preemptions,
            "num_steps": self.num_steps,
            "num_generated_tokens": self.num_generated,
            "num_computed_tokens": self.num_computed,
            "num_lookahead_steps": self.num_lookahead_steps,
            "cached_free_blocks": blocks.num_cached_free_blocks,
            "prefix_cache_hit_tokens": blocks.hit_tokens,
            "prefix_cache_queried_tokens": blocks.queried_tokens,
            "prefix_cache_hit_rate": blocks.hit_tokens / blocks.queried_tokens if blocks.queried_tokens else 0.0,
            **(self.runner.graphs.stats() if self.runner.graphs is not None else {}),
            **({"time_s": {"gpu": self.gpu_clock.seconds()}} if self.gpu_clock.on else {}),
        }

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[list[int]]:
        """Offline helper: run `prompts` together to completion; output token ids per prompt."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        rids = [f"gen-{next(_gen_ids)}" for _ in prompts]
        seqs = [self.add_request(r, p, sp) for r, p, sp in zip(rids, prompts, plist)]
        while any(not s.is_finished for s in seqs):
            if not self.step() and not self.has_work():
                raise RuntimeError("engine stalled: sequences are parked waiting for input")
        return [list(s.output_token_ids) for s in seqs]
