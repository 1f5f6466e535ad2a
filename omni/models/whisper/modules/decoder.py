"""Whisper's text decoder as an AR-engine model: paged self-attention, per-request cross-attention.

Each engine sequence is one 30 s window of one request. `prepare` computes that window's
cross-attention keys/values once, from the encoder output it was given, and keeps them in
`seq.model_state` until `release`; every step then reads them. Self-attention keys/values live
in the engine's paged cache. Cross-attention runs one SDPA call per sequence and layer: the
keys/values are never copied into a batch (stacking them would copy ~18 MB per tiny window
each time the batch changes, more than the per-call overhead it saves).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from omni.kernel.errors import InvalidRequest
from omni.models.whisper.config import WhisperConfig
from omni.models.whisper.modules.logits import WhisperRules
from omni.models.whisper.stages.stats import STATS
from omni.models.whisper.modules.layers import DecoderLayer, TextDecoder
from omni.models.weights import load_into
from omni.stages.ar.model_api import ARModel, ForwardBatch, ForwardOutput, KVCacheSpec
from omni.layers.attention import sdpa

if TYPE_CHECKING:
    from omni.stages.ar.sequence import Sequence

CROSS_KV = "cross_kv"  # model_state key: list over layers of (k, v), each [heads, S, head_dim]


class WhisperDecoder(ARModel):
    """`net` holds the weights; `proj_out` is None when tied to the token embeddings."""

    def __init__(self, cfg: WhisperConfig, net: TextDecoder, proj_out: torch.Tensor | None = None) -> None:
        self.cfg = cfg
        self.net = net
        self.layers = net.layers
        self.proj_out = proj_out

    @classmethod
    def from_pretrained(cls, model_dir: str, cfg: WhisperConfig, dtype: torch.dtype = torch.float32,
                        device: str = "cpu") -> "WhisperDecoder":
        net = TextDecoder(cfg)
        load_into(net, model_dir, "model.decoder", dtype, device)
        proj = None
        if not cfg.tie_word_embeddings:
            holder = nn.Module()
            holder.weight = nn.Parameter(torch.empty(cfg.vocab_size, cfg.d_model))
            load_into(holder, model_dir, "proj_out", dtype, device)
            proj = holder.weight
        return cls(cfg, net, proj)

    # ---- ARModel --------------------------------------------------------------------
    def kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(self.cfg.decoder_layers, self.cfg.decoder_heads, self.cfg.head_dim,
                           self.net.embed_tokens.weight.dtype, self.cfg.vocab_size)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.net.embed_tokens(input_ids)

    def logits_processors(self) -> list:
        return [WhisperRules()]

    def after_sample(self, seqs, tokens: torch.Tensor, hidden: torch.Tensor) -> None:
        """verbose_json: the drawn token's log-probability under the row the rules left."""
        timed = [i for i, s in enumerate(seqs) if STATS in s.model_state]
        if timed:
            host = tokens.tolist()
            for i in timed:
                stats = seqs[i].model_state[STATS]
                if host[i] >= 0 and stats.row is not None:
                    stats.after_sample(stats.row, host[i])
                stats.row = None
        return None

    def prepare(self, seq: "Sequence", inputs: dict[str, Any]) -> None:
        memory = inputs.get("encoder_out")
        if memory is None:
            raise InvalidRequest("a Whisper decoder sequence needs 'encoder_out'")
        weight = self.net.embed_tokens.weight
        memory = torch.as_tensor(memory).to(weight.device, weight.dtype)
        if memory.dim() != 2 or memory.shape[1] != self.cfg.d_model:
            raise InvalidRequest(f"encoder_out must be [frames, {self.cfg.d_model}], got {tuple(memory.shape)}")
        with torch.inference_mode():
            seq.model_state[CROSS_KV] = [layer.encoder_attn.keys_values(memory) for layer in self.layers]
        for key, value in inputs.items():
            if key != "encoder_out":
                seq.model_state[key] = value

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        x = self.net.embed_tokens(batch.input_ids) + self.net.embed_positions(batch.positions)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            q, k, v = attn.split(attn.q_proj(h)), attn.split(attn.k_proj(h)), attn.split(attn.v_proj(h))
            x = x + attn.out_proj(batch.attend(i, q, k, v).flatten(1))
            x = x + self._cross_attend(layer, i, layer.encoder_attn_layer_norm(x), batch)
            x = x + layer.mlp(x)
        return ForwardOutput(hidden=self.net.layer_norm(x))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.net.embed_tokens.weight if self.proj_out is None else self.proj_out
        return hidden @ weight.T

    def release(self, seq: "Sequence") -> None:
        seq.model_state.clear()

    # ---- cross-attention ------------------------------------------------------------
    def _cross_attend(self, layer: DecoderLayer, index: int, h: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        attn = layer.encoder_attn
        q = attn.split(attn.q_proj(h))  # [T, heads, head_dim]
        rows = []
        for span in batch.spans:
            k, v = span.seq.model_state[CROSS_KV][index]
            qs = q[span.row:span.row + span.num_tokens].transpose(0, 1)  # [heads, n, head_dim]
            # 4-D inputs: torch's CPU SDPA takes a much slower path for 3-D ones (~4x here)
            rows.append(sdpa(qs[None], k[None], v[None])[0].transpose(0, 1))
        return attn.out_proj(torch.cat(rows).flatten(1))

