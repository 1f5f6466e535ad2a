"""`CodecLM`: the multi-codebook talker as an AR-engine model, shared by every family with one.

A sequence is: prefill rows (a family's prompt, `request.FramePrompt`), then one position per
codec frame. The engine samples code group 0 from `codec_head`; right after, `after_sample`
runs the code predictor for the whole batch to fill groups 1..G-1 and stores the frame's input
for the next position:
    sum(codec_embedding(code0), code_predictor.codec_embedding[g-1](code_g) for g >= 1)
    + trailing text row k.
A frame is computed only when the talker goes on (transformers computes a frame's residual
codes while building the next step's input): not for codec EOS, nor for the last token
allowed by max_tokens.

Every position's token id is a placeholder (a suppressed id): the model always supplies input
embeddings. A family's subclass builds the parts in its `__init__` (its decoder layers, the
codec head, the code predictor, rotary tables, ids with `codec_eos`) and its `prepare`,
`from_checkpoint` and prompt building; the step (forward over the paged cache, codec head,
code predictor, frame feedback, stop rule) is this class's.
"""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

from omni.layers.rotary import mrope_cos_sin
from omni.stages.ar.model_api import (AfterSample, ARModel, DecodeForm, ForwardBatch, ForwardOutput, KVCacheSpec,
                                      PendingSample)
from omni.stages.ar.host_copy import HostCopy
from omni.stages.ar.sampler import SuppressTokens
from omni.stages.codec_lm.code_predictor import PREDICTOR_TOP_K, PREDICTOR_TOP_P, sampled_codes
from omni.stages.codec_lm.code_predictor_graphs import CodePredictorGraphs
from omni.stages.codec_lm.request import STATE_KEY, CodecLMRequest

log = logging.getLogger("omni.codec_lm")

SUPPRESSED_SPAN = 1024  # the talker never samples [vocab - 1024, vocab) except codec EOS


class CodecLM(nn.Module, ARModel):
    """The engine interface of a multi-codebook talker; a subclass sets, in its `__init__`:
    `text_cfg` (a DecoderConfig), `ids` (with `codec_eos`), `num_code_groups`, `model` (`layers`,
    `norm`, `codec_embedding`), `codec_head`, `code_predictor`, `inv_freq`, `mrope_section`,
    `suppress_token_ids`, `placeholder_id`, `max_model_len` (None) and `predictor_graphs` (None)."""

    supports_cuda_graphs = True  # forward reads no spans and, on CUDA, syncs no host
    predictor_top_k, predictor_top_p = PREDICTOR_TOP_K, PREDICTOR_TOP_P  # the code predictor's filters
    decode_form = DecodeForm(embeds=True, pos_lead=(3,), pos_dtype=torch.float32)  # frame embeddings, M-RoPE
    lookahead_decode = True  # the next step's input is the frame embedding kept on the device

    # ---- ARModel ------------------------------------------------------------------------
    def kv_cache_spec(self) -> KVCacheSpec:
        c = self.text_cfg
        return KVCacheSpec(c.num_layers, c.num_kv_heads, c.head_dim, self.codec_head.weight.dtype, c.vocab_size)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.codec_embedding(input_ids)

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        h = batch.inputs_embeds
        if h is None:
            h = self.embed_tokens(batch.input_ids)
        taps: dict[int, torch.Tensor] = {}
        if 0 in batch.tap_layers:
            taps[0] = h
        cos, sin = mrope_cos_sin(self.inv_freq, batch.positions, self.mrope_section, h.dtype)
        layers = self.model.layers
        normed = layers[0].input_layernorm(h) if layers else h
        for i, layer in enumerate(layers):
            attn = layer.self_attn
            q, k, v = attn.qkv(normed, cos, sin)
            out = batch.attend(i, q, k, v, attn.head_dim**-0.5)
            # residual add + RMSNorm as one fused kernel on CUDA (the thinker's), the same sums on CPU
            normed, h = layer.post_attention_layernorm.add_forward(attn.o_proj(out.reshape(h.shape[0], -1)), h)
            mlp = layer.mlp(normed)
            last = i + 1 == len(layers)
            norm = self.model.norm if last else layers[i + 1].input_layernorm
            normed, h = norm.add_forward(mlp, h)
            if i + 1 in batch.tap_layers and not last:
                taps[i + 1] = h
        h = normed if layers else self.model.norm(h)
        if len(layers) in batch.tap_layers:
            taps[len(layers)] = h
        return ForwardOutput(hidden=h, taps=taps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.codec_head(hidden)

    def positions(self, seq, start: int, end: int) -> torch.Tensor:
        """[3, end - start] float32: the prefill's (M-)RoPE positions, then index + delta."""
        inputs = seq.model_state[STATE_KEY].inputs
        n = inputs.positions.shape[1]
        parts = []
        if start < n:
            parts.append(inputs.positions[:, start : min(end, n)])
        if end > n:
            tail = torch.arange(max(start, n), end, dtype=torch.float32) + inputs.delta
            parts.append(tail.expand(3, -1))
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

    def input_embeds(self, seq, start: int, end: int) -> torch.Tensor:
        req: CodecLMRequest = seq.model_state[STATE_KEY]
        n = req.prefill_len
        rows = []
        if start < n:
            rows.append(req.inputs.prefill[start : min(end, n)])
        for pos in range(max(start, n), end):
            k = pos - n
            rows.append((req.frame_embeds[k] + req.inputs.trailing(k))[None])
        return torch.cat(rows) if len(rows) > 1 else rows[0]

    def decode_inputs(self, seqs, starts: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Every row a frame position (past its prefill): positions index + delta, inputs the frames'
        embeddings plus their text rows, in three launches for the whole batch (row by row otherwise,
        and where a subclass changed the row hooks)."""
        if type(self).input_embeds is not CodecLM.input_embeds or type(self).positions is not CodecLM.positions:
            return None
        reqs: list[CodecLMRequest] = [seq.model_state[STATE_KEY] for seq in seqs]
        ks = [p - r.prefill_len for p, r in zip(starts, reqs)]
        if any(k < 0 or r.inputs.positions.shape[1] != r.prefill_len for k, r in zip(ks, reqs)):
            return None
        pos = torch.tensor(starts, dtype=torch.float32) + torch.tensor([float(r.inputs.delta) for r in reqs])  # as `positions`
        frames = torch.stack([r.frame_embeds[k] for k, r in zip(ks, reqs)])
        return pos.expand(3, -1), frames + torch.stack([r.inputs.trailing(k) for k, r in zip(ks, reqs)])

    def input_ready(self, seq) -> bool:
        req: CodecLMRequest = seq.model_state[STATE_KEY]
        k = seq.num_tokens - 1 - req.prefill_len  # frame index of the newest position
        return k < 0 or req.inputs.trailing(k) is not None

    def logits_processors(self) -> list:
        """The codec specials are never sampled (codec EOS excepted)."""
        return [SuppressTokens(self.suppress_token_ids, self.text_cfg.vocab_size, self.codec_head.weight.device)]

    @torch.inference_mode()
    def after_sample(self, seqs, tokens: torch.Tensor, hidden: torch.Tensor) -> PendingSample:
        """The code predictor fills groups 1..G-1 for every row while the codes stay on the
        device; every row's frame embedding is kept on the device at once (the next step's input:
        a row that does not go on ends with this step, so its frame is never read), and one
        non-blocking copy brings all codes to the host; `resolve` waits for it."""
        reqs: list[CodecLMRequest] = [seq.model_state[STATE_KEY] for seq in seqs]
        code0 = tokens.clamp_min(0)  # -1: a non-finite row, failed by the engine
        code0_embed = self.model.codec_embedding(code0)
        codes, embeds = self._predict_codes(hidden.to(code0_embed.dtype), code0_embed, reqs)
        frames = torch.cat((code0_embed[:, None], embeds), dim=1).sum(1)
        goes_on = self.goes_on(seqs, tokens)
        for i, req in enumerate(reqs):
            req.frame_embeds.append(frames[i])
        copy = HostCopy(torch.cat((tokens[:, None], goes_on[:, None].long(), code0[:, None], codes), dim=1))

        def finish() -> AfterSample:
            host = copy.wait()
            sampled, go, all_codes = host[:, 0].tolist(), host[:, 1].tolist(), host[:, 2:]
            return AfterSample([{"codes": all_codes[i]} if go[i] else {} for i in range(len(reqs))], sampled)

        return PendingSample(finish)

    def use_predictor_graphs(self, max_batch: int) -> None:
        """Frames run the code predictor from one CUDA graph per batch bucket, sampling included,
        all captured now (the static path runs eagerly on CPU). Called by the stage when its
        engine has `cuda_graphs` on."""
        device = self.codec_head.weight.device
        self.predictor_graphs = CodePredictorGraphs(self.code_predictor, max_batch, device,
                                                    self.predictor_top_k, self.predictor_top_p)
        if self.predictor_graphs.capture:
            t0 = time.monotonic()
            n = self.predictor_graphs.capture_all()
            log.info("code predictor: %d graphs captured in %.1f s", n, time.monotonic() - t0)

    def _predict_codes(self, past_hidden: torch.Tensor, code0_embed: torch.Tensor,
                       reqs: list[CodecLMRequest]) -> tuple[torch.Tensor, torch.Tensor]:
        """Groups 1..G-1 with each row's sampling (greedy rows argmax), from the graphs when on."""
        dev = past_hidden.device
        temperature = torch.tensor([0.0 if r.greedy else r.predictor_temperature for r in reqs]).to(dev, non_blocking=True)
        seed = torch.tensor([r.seed for r in reqs], dtype=torch.long).to(dev, non_blocking=True)
        frame = torch.tensor([len(r.frame_embeds) for r in reqs], dtype=torch.long).to(dev, non_blocking=True)
        graphs = self.predictor_graphs
        if graphs is not None:
            out = graphs.run(past_hidden, code0_embed, temperature, seed, frame)
            if out is not None:
                return out
        return self.code_predictor.predict(past_hidden, code0_embed, sampled_codes(
            temperature, seed, frame, self.num_code_groups, self.predictor_top_k, self.predictor_top_p))

    def goes_on(self, seqs, tokens: torch.Tensor) -> torch.Tensor:
        """[B] bool on the device: False where the drawn token ends the sequence (no frame is
        computed for it then): codec EOS, a stop id, a failed row (-1), or the last token that
        max_tokens / max_model_len allow. The limits are known before the draw, so the rule needs
        one small upload and no sync; its answer rides in the step's one copy to the host."""
        stops = [(self.ids.codec_eos, *seq.params.stop_token_ids) for seq in seqs]
        width = max(map(len, stops))
        rules = torch.tensor([[int(self._room_for_one_more(seq)), *ids, *(-1,) * (width - len(ids))]
                              for seq, ids in zip(seqs, stops)], dtype=torch.long).to(tokens.device, non_blocking=True)
        stopped = (tokens[:, None] == rules[:, 1:]).any(1)
        return (rules[:, 0] > 0) & (tokens >= 0) & ~stopped

    def _room_for_one_more(self, seq) -> bool:
        """Whether max_tokens and max_model_len leave room past the token being drawn."""
        if len(seq.output_token_ids) + 1 >= seq.params.max_tokens:
            return False
        return self.max_model_len is None or seq.num_tokens + 1 <= self.max_model_len

    def release(self, seq) -> None:
        seq.model_state.clear()
