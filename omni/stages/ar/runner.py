"""Turns a scheduled step into one flat `ForwardBatch`, runs the model, picks sampling rows.

The only engine module that builds tensors for the model. Decode-only steps produce
fixed-shape inputs ([B] ids and positions, [B, max_blocks] block tables) here and in
`AttentionMetadata.build`; with `graphs` (cuda_graphs.py) they are replayed from CUDA graphs.
"""

from __future__ import annotations

import torch

from typing import Callable

from omni.layers.paged_attention import AttentionMetadata
from omni.stages.ar.graph_inputs import GraphDecodeStep
from omni.stages.ar.model_api import ARModel, ForwardBatch, ForwardOutput, SeqSpan
from omni.stages.ar.scheduler import ScheduledSeq


class ModelRunner:
    def __init__(self, model: ARModel, kv_cache: torch.Tensor, block_size: int, device, graphs=None,
                 decode_kernel: Callable | None = None) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.device = torch.device(device)
        self.graphs = graphs  # DecodeGraphs or None
        self.decode_kernel = decode_kernel

    def prepare(self, scheduled: list[ScheduledSeq], tap_layers: tuple[int, ...]) -> ForwardBatch | GraphDecodeStep:
        """The step's inputs: a decode step that fits a graph goes straight into its static
        buffers (`GraphDecodeStep`); anything else becomes a flat `ForwardBatch`."""
        if self.graphs is not None:
            step = self.graphs.prepare_decode(scheduled, tap_layers)
            if step is not None:
                return step
        ids: list[int] = []
        slots: list[int] = []
        spans: list[SeqSpan] = []
        positions: list[torch.Tensor] = []
        embeds: list[tuple[int, torch.Tensor]] = []
        bs = self.block_size
        for item in scheduled:
            seq, start, end = item.seq, item.start, item.end
            spans.append(SeqSpan(seq, start, end, len(ids)))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            positions.append(self.model.positions(seq, start, end))
            emb = self.model.input_embeds(seq, start, end)
            if emb is not None:
                embeds.append((len(ids), emb))
            ids.extend(seq.token_ids(start, end))
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        inputs_embeds = None
        if embeds:
            inputs_embeds = self.model.embed_tokens(input_ids).clone()
            for row, emb in embeds:
                inputs_embeds[row : row + emb.shape[0]] = emb.to(inputs_embeds.device, inputs_embeds.dtype)
        attn = AttentionMetadata.build(
            slots,
            [s.seq.block_table for s in spans],
            [s.start for s in spans],
            [s.end for s in spans],
            bs,
            self.device,
        )
        attn.decode_kernel = self.decode_kernel
        return ForwardBatch(
            input_ids=input_ids,
            positions=torch.cat(positions, dim=-1).to(self.device),
            inputs_embeds=inputs_embeds,
            spans=spans,
            attn=attn,
            kv_cache=self.kv_cache,
            tap_layers=tap_layers,
        )

    def feed_ids(self, batch: ForwardBatch | GraphDecodeStep, ids: torch.Tensor) -> None:
        """Overwrite a prepared step's input ids with ids on the device (a lookahead step's, sampled
        by the step before it: omni/stages/ar/lookahead.py), queued after its host inputs."""
        ids = ids.clamp_min(0)  # -1: a failed row, whose successor's output is dropped
        target = batch.static.batch.input_ids if isinstance(batch, GraphDecodeStep) else batch.input_ids
        target[: ids.shape[0]].copy_(ids)

    @torch.inference_mode()
    def run(self, batch: ForwardBatch | GraphDecodeStep) -> ForwardOutput:
        if isinstance(batch, GraphDecodeStep):
            return self.graphs.replay(batch)
        if self.graphs is not None and self.graphs.can_run(batch):
            out = self.graphs.run(batch)
            if out is not None:
                return out
        return self.model.forward(batch)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)
