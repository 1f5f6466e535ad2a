"""CUDA graphs for the AR engine's decode steps.

A decode-only step (one token per sequence) is replayed from a graph captured for its shape
key: the batch padded up to a bucket (1, 2, 4, 8, then multiples of 8), the attention
context padded up to a power-of-two number of blocks (the whole `max_model_len` when a
paged decode kernel reads only the blocks it needs), the hidden-state taps, the form of
the inputs (embeddings or ids; rope position shape) and the sampler's mode. The graph holds
the whole step: forward, logits and the engine's sampler (when its processors are graph-safe),
so a replay returns the sampled tokens. `capture_all` records every key serving can hit at
start-up (the engine's `warmup`), into one shared memory pool; a key missed there is captured
on first use, and counted. Prefill and mixed steps run eagerly.

Fixed-shape inputs live in static buffers that each step fills before replay. Padding rows
write their keys/values into a scratch block the engine allocates beyond the block manager's
blocks (`num_blocks`), attend only to that slot, and are dropped from the outputs, so they
never touch a real sequence's cache. The model's forward must be free of host syncs and must
not read `batch.spans` in decode (models opt in with `supports_cuda_graphs = True`).

On CPU (tests) the same padded, fixed-shape path runs eagerly without capture, so its
bookkeeping is checked where no GPU is available. A capture that fails disables graphs for
good, with a warning, and the engine goes on eagerly.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from omni.layers.paged_attention import AttentionMetadata
from omni.layers.graph_capture import capture_graph
from omni.stages.ar.graph_inputs import GraphDecodeStep, StagedInputs, decode_rows, numpy_dtype
from omni.stages.ar.model_api import ARModel, DecodeForm, ForwardBatch, ForwardOutput
from omni.stages.ar.sampler import SMALL_VOCAB, Sampler, SampleMode

log = logging.getLogger("omni.ar.cuda_graphs")
MIN_CTX_BLOCKS = 8


def batch_buckets(max_batch: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(8, max_batch, 8))[1:]
    return sorted(set(sizes) | {max_batch})


def _bucket(n: int, sizes: list[int]) -> int:
    return next(b for b in sizes if b >= n)


@dataclass
class _Static:
    """One key's fixed-shape inputs, its batch view, and (after capture) its graph and outputs."""

    batch: ForwardBatch
    k_pos: torch.Tensor
    staged: StagedInputs
    mode: SampleMode | None = None  # None: the graph stops at the hidden states
    graph: Any = None
    out: ForwardOutput | None = None


class DecodeGraphs:
    def __init__(
        self,
        model: ARModel,
        kv_cache: torch.Tensor,
        block_size: int,
        max_model_len: int,
        max_batch: int,
        scratch_block: int,
        device,
        decode_kernel: Callable | None = None,
        sampler: Sampler | None = None,
    ) -> None:
        self.model, self.kv_cache, self.block_size = model, kv_cache, block_size
        self.device = torch.device(device)
        self.capture = self.device.type == "cuda"
        self.sizes = batch_buckets(max_batch)
        self.max_batch = max_batch
        self.max_blocks = -(-max_model_len // block_size)
        self.scratch_block = scratch_block
        self.decode_kernel = decode_kernel
        self.sampler = sampler if sampler is not None and sampler.graph_safe else None
        self.statics: dict[tuple, _Static] = {}
        self.pool = None
        self.disabled: str | None = None
        self.num_replays = 0
        self.num_captures = 0
        self.late_captures = 0  # captures after `capture_all` (a key start-up did not foresee)
        self.warmed = False
        self.capture_seconds = 0.0
        self._moved = False

    # ---- start-up ---------------------------------------------------------------------
    def keys(self, form: DecodeForm, tap_variants: list[tuple[int, ...]]) -> list[tuple]:
        """Every key a decode step can have with this model's input form."""
        bs = self.block_size
        ctx = {self._ctx_blocks_for(n * bs) for n in range(1, self.max_blocks + 1)}  # the buckets steps take
        modes: list[SampleMode | None] = [None]
        if self.sampler is not None:
            small = self.sampler.vocab_size <= SMALL_VOCAB
            modes = [SampleMode.FILTER] if small else [SampleMode.SAMPLE, SampleMode.FILTER]
        return [(size, c, tuple(taps), form.embeds, tuple(form.pos_lead), form.pos_dtype, mode)
                for size in self.sizes for c in sorted(ctx) for taps in tap_variants for mode in modes]

    def capture_all(self, form: DecodeForm, tap_variants: list[tuple[int, ...]], progress=None) -> int:
        """Capture every key up front (before the stage says it is ready); returns the count.
        `progress(done, total)` is called after each key."""
        keys = self.keys(form, tap_variants)
        embeds_like = self.model.embed_tokens(torch.zeros(1, dtype=torch.long, device=self.device)) if form.embeds else None
        for i, key in enumerate(keys):
            if self._static(key, embeds_like) is None:
                break  # capture failed: graphs are off, decode runs eagerly
            if progress is not None:
                progress(i + 1, len(keys))
        self.warmed = True
        return len(self.statics)

    # ---- public -----------------------------------------------------------------------
    def can_run(self, batch: ForwardBatch) -> bool:
        return (
            self.disabled is None
            and batch.is_decode
            and batch.num_tokens == len(batch.spans)
            and batch.num_tokens <= self.max_batch
        )

    def run(self, batch: ForwardBatch) -> ForwardOutput | None:
        """The step's outputs (rows of the real batch only), or None to run it eagerly."""
        static = self._static(self._key(batch), batch.inputs_embeds)
        if static is None:
            return None
        self._fill(static, batch)
        return self.replay(GraphDecodeStep(batch.spans, static, batch.num_tokens))

    def prepare_decode(self, scheduled: list, tap_layers: tuple[int, ...]) -> GraphDecodeStep | None:
        """The fast path of a decode step (one token per sequence, `scheduled` from the
        scheduler): its inputs go straight into the static buffers through the host mirror.
        None when the step does not fit (too big, mixed embeddings, graphs off): run it the
        general way."""
        n = len(scheduled)
        if self.disabled is not None or n > self.max_batch or any(s.num_tokens != 1 for s in scheduled):
            return None
        spans, ids, slots, lens, pos, emb, tables = decode_rows(self.model, scheduled, self.block_size)
        if isinstance(emb, list):
            return None  # some rows embed their ids, some do not: the general path merges them
        has_embeds = emb is not None
        if numpy_dtype(pos.dtype) is None:
            return None
        seqs = [s.seq for s in spans]
        key = (_bucket(n, self.sizes), self._ctx_blocks_for(max(lens)), tuple(tap_layers), has_embeds,
               tuple(pos.shape[:-1]), pos.dtype, self._mode(seqs))
        static = self._static(key, emb)
        if static is None:
            return None
        static.staged.write(ids, slots, lens, pos.cpu().numpy(), tables, self._sample_slots(seqs))
        if emb is not None:
            s = static.batch.inputs_embeds
            s[:n].copy_(emb)
            if n < s.shape[0]:
                s[n:].zero_()
        return GraphDecodeStep(spans, static, n)

    def replay(self, step: GraphDecodeStep) -> ForwardOutput:
        """Run the step's graph (or, on CPU, its padded body); outputs of the real rows only."""
        static, n = step.static, step.num_tokens
        if static.graph is not None:
            static.graph.replay()
            out = static.out
        else:
            out = self._body(static)
        self.num_replays += 1
        tokens = None if out.tokens is None else out.tokens[:n]
        return ForwardOutput(out.hidden[:n], {t: v[:n] for t, v in out.taps.items()}, tokens)

    def stats(self) -> dict[str, Any]:
        return {"graphs": sum(s.graph is not None for s in self.statics.values()), "shapes": len(self.statics),
                "decode_graph_steps": self.num_replays, "graphs_disabled": self.disabled,
                "graph_captures": self.num_captures, "graph_late_captures": self.late_captures,
                "graph_capture_seconds": round(self.capture_seconds, 3)}

    def _mode(self, seqs: list) -> SampleMode | None:
        return None if self.sampler is None else self.sampler.mode_for(seqs, graph=True)

    def _sample_slots(self, seqs: list) -> list[int]:
        if self.sampler is None:
            return [0] * len(seqs)
        return [s.sample_slot for s in seqs]

    # ---- shapes -----------------------------------------------------------------------
    def _ctx_blocks_for(self, max_seq_len: int) -> int:
        if self.decode_kernel is not None:
            return self.max_blocks  # the kernel reads only each sequence's own blocks
        need = -(-max_seq_len // self.block_size)
        blocks = MIN_CTX_BLOCKS
        while blocks < need:
            blocks *= 2
        return min(blocks, self.max_blocks)

    def _key(self, batch: ForwardBatch) -> tuple:
        pos = batch.positions
        return (_bucket(batch.num_tokens, self.sizes), self._ctx_blocks_for(batch.attn.max_seq_len),
                tuple(batch.tap_layers), batch.inputs_embeds is not None, tuple(pos.shape[:-1]), pos.dtype,
                self._mode([s.seq for s in batch.spans]))

    def _static(self, key: tuple, embeds_like: torch.Tensor | None) -> _Static | None:
        """The key's static buffers (and graph, captured on first use); None if capture failed."""
        static = self.statics.get(key)
        if static is None:
            static = self._new_static(key, embeds_like)
            if self.capture:
                t0 = time.monotonic()
                if not self._capture(static):
                    return None
                self.capture_seconds += time.monotonic() - t0
                if self.warmed:
                    self.late_captures += 1
                    log.warning("decode graph for %s captured after start-up (%.2f s)", key, time.monotonic() - t0)
            self.statics[key] = static
        return static

    def _new_static(self, key: tuple, embeds_like: torch.Tensor | None) -> _Static:
        size, ctx_blocks, taps, embeds, pos_lead, pos_dtype, mode = key
        dev, bs = self.device, self.block_size
        max_seq = ctx_blocks * bs
        sample_scratch = self.sampler.scratch_slot if self.sampler is not None else 0
        staged = StagedInputs(size, ctx_blocks, pos_lead, pos_dtype, self.scratch_block, bs, dev, sample_scratch)
        attn = AttentionMetadata(
            slot_mapping=staged.dev["slot_mapping"],
            block_tables=staged.dev["block_tables"],
            seq_lens=staged.dev["seq_lens"],
            query_lens=[1] * size,
            pad_rows=torch.arange(size, device=dev),
            attn_mask=torch.zeros(size, 1, 1, max_seq, dtype=torch.bool, device=dev),
            max_query_len=1,
            max_seq_len=max_seq,
            decode_kernel=self.decode_kernel,
        )
        inputs_embeds = None
        if embeds:
            inputs_embeds = torch.zeros(size, embeds_like.shape[-1], dtype=embeds_like.dtype, device=dev)
        batch = ForwardBatch(
            input_ids=staged.dev["input_ids"],
            positions=staged.dev["positions"],
            inputs_embeds=inputs_embeds,
            spans=[],
            attn=attn,
            kv_cache=self.kv_cache,
            tap_layers=taps,
        )
        return _Static(batch, torch.arange(max_seq, device=dev), staged, mode)

    def _fill(self, static: _Static, batch: ForwardBatch) -> None:
        """Copy the step's inputs into the static buffers; padding rows point at the scratch slot."""
        s, n, bs = static.batch, batch.num_tokens, self.block_size
        a, src = s.attn, batch.attn
        static.staged.invalidate()  # written directly here, not through the host mirror
        s.input_ids[:n].copy_(batch.input_ids)
        s.input_ids[n:].zero_()
        s.positions[..., :n].copy_(batch.positions)
        s.positions[..., n:].zero_()
        if s.inputs_embeds is not None:
            s.inputs_embeds[:n].copy_(batch.inputs_embeds)
            s.inputs_embeds[n:].zero_()
        a.slot_mapping[:n].copy_(src.slot_mapping)
        a.slot_mapping[n:].fill_(self.scratch_block * bs)
        width = min(src.block_tables.shape[1], a.block_tables.shape[1])
        a.block_tables[:n].zero_()
        a.block_tables[:n, :width].copy_(src.block_tables[:, :width])
        a.block_tables[n:].fill_(self.scratch_block)
        a.seq_lens[:n].copy_(src.seq_lens)
        a.seq_lens[n:].fill_(1)
        sample_slots = static.staged.dev["sample_slots"]
        sample_slots.fill_(static.staged.sample_scratch)
        if static.mode is not None:
            sample_slots[:n].copy_(self.sampler.slots_of([sp.seq for sp in batch.spans]))

    # ---- capture ----------------------------------------------------------------------
    def _body(self, static: _Static) -> ForwardOutput:
        a = static.batch.attn
        a.attn_mask.copy_((static.k_pos[None, :] < a.seq_lens[:, None])[:, None, None, :])
        out = self.model.forward(static.batch)
        if static.mode is not None:
            logits = self.model.compute_logits(out.hidden)
            out.tokens = self.sampler.sample(logits, static.staged.dev["sample_slots"], static.mode)
        return out

    def _tensors_to_device(self) -> None:
        """Plain tensor attributes (e.g. rotary `inv_freq` kept on the host) would be copied to
        the GPU inside the graph on every call: move them once, before the first capture."""
        if self._moved or not isinstance(self.model, torch.nn.Module):
            return
        for module in self.model.modules():
            for name, value in list(vars(module).items()):
                if isinstance(value, torch.Tensor) and value.device != self.device:
                    setattr(module, name, value.to(self.device))
        self._moved = True

    def _capture(self, static: _Static) -> bool:
        try:
            self._tensors_to_device()
            static.graph, static.out = capture_graph(lambda: self._body(static), self.device, self.pool)
            self.pool = static.graph.pool()
            self.num_captures += 1
            return True
        except Exception as exc:  # a model that syncs the host, or a kernel that cannot be captured
            self.disabled = f"{type(exc).__name__}: {exc}"
            log.warning("CUDA-graph capture failed, decode runs eagerly from now on: %s", self.disabled)
            torch.cuda.current_stream(self.device).synchronize()
            return False
