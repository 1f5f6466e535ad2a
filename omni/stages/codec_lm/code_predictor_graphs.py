"""CUDA graphs for the code predictor's whole per-frame loop, sampling included.

Per talker step `CodePredictor.predict` runs G-1 short decode steps of a small decoder for
the batch: dozens of small kernels per step, so on a GPU a frame is launch-bound. Here the
loop is unrolled over static buffers and, on CUDA, captured into ONE graph per batch bucket
(the AR engine's buckets: 1, 2, 4, 8, then multiples of 8):
  - each layer's cache holds G positions per row (2 prefill rows, then one per fed-back
    code) and is written in place;
  - every row of a call is at the same position, so unrolled step g attends to a fixed-length
    prefix of the cache: no mask, and the same maths as the eager loop;
  - the engine's sampler (`sample_rows`: greedy rows argmax, sampling rows top-k 50 / top-p 0.8
    with hashed per-row noise) and the embedding lookup of the chosen code run inside the graph.
Padding rows (up to the bucket) hold zeros and are dropped; rows never mix, so padding cannot
change a real row. Per-row temperature, seed and frame index are static inputs.

On CUDA with triton (and the stage's `fused_ops` on) the graph records the fused frame
(`omni/layers/predictor_frame.py`: ~27 kernels a step instead of ~150); elsewhere the same static
path runs eagerly, without capture, so tests check it against `predict` (and the fused frame in
triton's interpreter). A capture that fails disables the graphs for good, with a warning; callers
then run `predict`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from omni.layers import fused_ops, predictor_kernels
from omni.layers.predictor_frame import FusedPredictorFrame
from omni.layers.rotary import rope_cos_sin
from omni.stages.codec_lm.code_predictor import PREDICTOR_TOP_K, PREDICTOR_TOP_P, CodePredictor, predictor_rows
from omni.stages.ar.cuda_graphs import batch_buckets
from omni.layers.graph_capture import capture_graph
from omni.stages.ar.sampler import SampleMode, sample_rows

log = logging.getLogger("omni.code_predictor_graphs")


@dataclass
class _Static:
    """One bucket's fixed buffers: inputs, per-layer caches, outputs, and (on CUDA) the graph."""

    hidden: torch.Tensor  # [B, H] the talker's last hidden state per row
    code0: torch.Tensor  # [B, H] embedding of code group 0
    temperature: torch.Tensor  # [B] float32, 0 = greedy row
    seed: torch.Tensor  # [B] int64
    frame: torch.Tensor  # [B] int64: the frame's index in its request (the draw counter's base)
    keys: list[torch.Tensor]  # per layer [B, kv_heads, G, hd]
    values: list[torch.Tensor]
    codes: torch.Tensor  # [B, G-1] int64
    embeds: torch.Tensor  # [B, G-1, H]
    graph: Any = None


class CodePredictorGraphs:
    def __init__(self, predictor: CodePredictor, max_batch: int, device, top_k: int = PREDICTOR_TOP_K,
                 top_p: float = PREDICTOR_TOP_P, fused: bool | None = None) -> None:
        """`fused`: run the frame on the fused kernels (None: on CUDA with triton and fused ops on)."""
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.predictor = predictor
        self.top_k, self.top_p = top_k, top_p
        self.device = torch.device(device)
        self.capture = self.device.type == "cuda"
        self.sizes = batch_buckets(max_batch)
        self.max_batch = max_batch
        weight = predictor.lm_head[0].weight
        self.dtype = weight.dtype
        positions = torch.arange(predictor.num_code_groups, device=self.device)
        self.cos, self.sin = rope_cos_sin(predictor.inv_freq.to(self.device), positions, self.dtype)
        self.vocab_ids = torch.arange(predictor.spec.vocab_size, device=self.device)
        if fused is None:
            fused = fused_ops.enabled(weight) and predictor_kernels.available(weight)
        self.fused = FusedPredictorFrame(predictor, self.cos, self.sin, top_k, top_p) if fused else None
        self.statics: dict[int, _Static] = {}
        self.pool = None
        self.disabled: str | None = None
        self.num_runs = 0

    # ---- public -----------------------------------------------------------------------
    def can_run(self, batch: int) -> bool:
        return self.disabled is None and 1 <= batch <= self.max_batch

    @torch.inference_mode()
    def run(self, past_hidden: torch.Tensor, code0_embed: torch.Tensor, temperature: torch.Tensor | None = None,
            seed: torch.Tensor | None = None, frame: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Codes [B, G-1] and their embeddings [B, G-1, H], as `predict` with `sampled_codes`
        gives them for the same per-row temperature / seed / frame (default: greedy rows);
        None when the graphs are disabled (run `predict` then)."""
        n = past_hidden.shape[0]
        if not self.can_run(n):
            return None
        size = next(b for b in self.sizes if b >= n)
        static = self.statics.get(size)
        if static is None:
            static = self._new_static(size)
            if self.capture and not self._capture(static):
                return None
            self.statics[size] = static
        static.hidden[:n].copy_(past_hidden)
        static.code0[:n].copy_(code0_embed)
        static.hidden[n:].zero_()
        static.code0[n:].zero_()
        for buf, value in ((static.temperature, temperature), (static.seed, seed), (static.frame, frame)):
            if value is None:
                buf.zero_()
            else:
                buf[:n].copy_(value, non_blocking=True)
                buf[n:].zero_()
        if static.graph is not None:
            static.graph.replay()
        else:
            self._body(static)
        self.num_runs += 1
        return static.codes[:n].clone(), static.embeds[:n].clone()

    def capture_all(self) -> int:
        """Capture every batch bucket now (start-up), so that no frame waits on a capture."""
        for size in self.sizes:
            if size not in self.statics:
                static = self._new_static(size)
                if self.capture and not self._capture(static):
                    break
                self.statics[size] = static
        return len(self.statics)

    def stats(self) -> dict[str, Any]:
        return {"code_predictor_graphs": sum(s.graph is not None for s in self.statics.values()),
                "code_predictor_fused": self.fused is not None,
                "code_predictor_graph_runs": self.num_runs, "code_predictor_graphs_disabled": self.disabled}

    # ---- the unrolled loop ------------------------------------------------------------
    def _new_static(self, size: int) -> _Static:
        p, dev, dt = self.predictor, self.device, self.dtype
        spec, groups = p.spec, p.num_code_groups
        hidden = p.embed_dim  # inputs and code embeddings are at the talker's width
        cache = (size, spec.num_kv_heads, groups, spec.head_dim)
        return _Static(
            hidden=torch.zeros(size, hidden, dtype=dt, device=dev),
            code0=torch.zeros(size, hidden, dtype=dt, device=dev),
            temperature=torch.zeros(size, dtype=torch.float32, device=dev),
            seed=torch.zeros(size, dtype=torch.long, device=dev),
            frame=torch.zeros(size, dtype=torch.long, device=dev),
            keys=[torch.zeros(cache, dtype=dt, device=dev) for _ in p.model.layers],
            values=[torch.zeros(cache, dtype=dt, device=dev) for _ in p.model.layers],
            codes=torch.zeros(size, groups - 1, dtype=torch.long, device=dev),
            embeds=torch.zeros(size, groups - 1, hidden, dtype=dt, device=dev),
        )

    def _body(self, s: _Static) -> None:
        """`CodePredictor.predict` with `sampled_codes`, over `s`'s buffers (what the graph records)."""
        if self.fused is not None:
            self.fused.run(s)
            return
        p = self.predictor
        groups = p.num_code_groups
        base = s.frame * (groups - 1)
        x = p.project(torch.stack((s.hidden, s.code0), dim=1))
        start = 0
        for g in range(p.num_code_groups - 1):
            end = start + x.shape[1]
            cos, sin = self.cos[start:end], self.sin[start:end]
            h = x
            for layer, keys, values in zip(p.model.layers, s.keys, s.values):
                h = layer.forward_static(h, cos, sin, keys, values, start)
            start = end
            rows = predictor_rows(s.temperature, s.seed, base + g, self.top_k, self.top_p)
            code = sample_rows(p.lm_head[g](p.model.norm(h[:, -1])), rows, SampleMode.FILTER, self.vocab_ids)
            emb = p.model.codec_embedding[g](code)
            s.codes[:, g].copy_(code)
            s.embeds[:, g].copy_(emb)
            x = p.project(emb[:, None])

    def _capture(self, static: _Static) -> bool:
        try:
            static.graph, _ = capture_graph(lambda: self._body(static), self.device, self.pool)
            self.pool = static.graph.pool()
            return True
        except Exception as exc:  # a kernel that cannot be captured
            self.disabled = f"{type(exc).__name__}: {exc}"
            log.warning("code-predictor CUDA-graph capture failed, it runs eagerly from now on: %s", self.disabled)
            torch.cuda.current_stream(self.device).synchronize()
            return False
