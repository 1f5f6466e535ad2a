"""The Qwen3-Omni talker as an AR-engine model: MoE decoder over codec frames + code predictor.

A talker sequence is: prefill rows built from the thinker's states (`talker_inputs`), then
one position per codec frame. The engine samples code group 0 from `codec_head`; right
after, `after_sample` runs the code predictor for the whole batch to fill groups 1..G-1
and stores the frame's input for the next position:
    sum(codec_embedding(code0), code_predictor.codec_embedding[g-1](code_g) for g >= 1)
    + trailing text row k (thinker text, then tts_eos, then tts_pad).
A frame is computed only when the talker goes on (transformers computes a frame's residual
codes while building the next step's input): not for codec EOS, nor for the last token
allowed by max_tokens.

Prefix caching (`prefix_key`): blocks of the prefill's user part (the conversation's user turns)
are keyed by the thinker rows they were projected from and their rope positions, so turn N
reuses turn N-1's; the assistant part and the codec frames are never cached.

Every position's token id is a placeholder (`codec_pad`, a suppressed id): the model always
supplies input embeddings, and the stage asks the engine to apply the repetition penalty to
generated codes only, as transformers does for a talker prompted with embeddings.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from hashlib import blake2b
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omni.kernel.errors import InvalidRequest
from omni.models.qwen3_omni.modules.code_predictor import PREDICTOR_TOP_K, PREDICTOR_TOP_P, CodePredictor, sampled_codes
from omni.models.qwen3_omni.modules.code_predictor_graphs import CodePredictorGraphs
from omni.models.qwen3_omni.config import DecoderConfig, Qwen3OmniConfig, load_config
from omni.models.qwen3_omni.modules.rope import DEFAULT_MROPE_SECTION, mrope_cos_sin
from omni.models.qwen3_omni.modules.talker_inputs import TalkerInputs, TalkerParts, TalkerTokenIds
from omni.layers.attention import QKVProjection
from omni.layers.mlp import MLP
from omni.layers.moe import SharedExpertMoE, tied_router_experts
from omni.layers.norms import RMSNorm
from omni.layers.rotary import rope_inv_freq
from omni.models.weights import CheckpointError, checkpoint_files, load_state_dict, load_weights
from omni.stages.ar.sampler import SuppressTokens
from omni.stages.ar.model_api import ARModel, DecodeForm, ForwardBatch, ForwardOutput, KVCacheSpec

log = logging.getLogger("omni.talker")

SUPPRESSED_SPAN = 1024  # the talker never samples [vocab - 1024, vocab) except codec EOS


@dataclass
class TalkerRequest:
    """Per-sequence talker state, kept in `seq.model_state["talker"]` until release."""

    inputs: TalkerInputs
    greedy: bool
    seed: int = 0  # the code predictor's draws (the talker's own go through the engine's sampler)
    predictor_temperature: float = 1.0  # the code predictor's when the talker samples (greedy: 0)
    frame_embeds: list[torch.Tensor] = field(default_factory=list)  # per computed frame [H]

    @property
    def prefill_len(self) -> int:
        return int(self.inputs.prefill.shape[0])


class _Layer(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        bias = bool(c.raw.get("attention_bias", False))
        self.self_attn = QKVProjection(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps, bias)
        self.mlp = SharedExpertMoE(
            c.hidden_size, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size,
            c.shared_expert_intermediate_size, c.norm_topk_prob,
        )
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class _Decoder(nn.Module):
    """`talker.model.*`: layers, final norm and the codec embedding."""

    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Layer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.codec_embedding = nn.Embedding(c.vocab_size, c.hidden_size)


class TalkerModel(nn.Module, ARModel):
    supports_cuda_graphs = True  # forward reads no spans and, on CUDA, syncs no host
    predictor_top_k, predictor_top_p = PREDICTOR_TOP_K, PREDICTOR_TOP_P  # the code predictor's filters
    decode_form = DecodeForm(embeds=True, pos_lead=(3,), pos_dtype=torch.float32)  # frame embeddings, M-RoPE
    def __init__(self, cfg: Qwen3OmniConfig) -> None:
        nn.Module.__init__(self)
        if cfg.talker is None:
            raise InvalidRequest("this checkpoint has no talker (enable_audio_output is off)")
        t = cfg.talker
        c = t.text
        if c.hidden_act != "silu" or c.num_experts < 1 or c.shared_expert_intermediate_size < 1:
            raise CheckpointError("talker: expected a silu MoE decoder with a shared expert")
        if t.code_predictor.hidden_size != c.hidden_size:
            raise CheckpointError("talker: code predictor hidden size differs from the talker's")
        self.cfg, self.text_cfg = cfg, c
        self.ids = TalkerTokenIds.from_config(cfg)
        self.num_code_groups = t.num_code_groups
        self.model = _Decoder(c)
        self.codec_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.text_projection = MLP(t.thinker_hidden_size, c.intermediate_size, c.hidden_size)
        self.hidden_projection = MLP(t.thinker_hidden_size, c.intermediate_size, c.hidden_size)
        self.code_predictor = CodePredictor(t.code_predictor, t.num_code_groups)
        self.inv_freq = rope_inv_freq(c.head_dim, c.rope_theta)  # float32 whatever the weights' dtype
        self.mrope_section = tuple(c.mrope_section) or DEFAULT_MROPE_SECTION
        self.register_buffer("tts_embeds", torch.zeros(3, c.hidden_size), persistent=False)
        self.suppress_token_ids = tuple(
            i for i in range(c.vocab_size - SUPPRESSED_SPAN, c.vocab_size) if i != self.ids.codec_eos
        )
        self.placeholder_id = self.ids.codec_pad
        if self.placeholder_id not in self.suppress_token_ids:
            self.placeholder_id = self.suppress_token_ids[-1]
        self.max_model_len: int | None = None  # set by the stage: the engine's length limit
        self.predictor_graphs: CodePredictorGraphs | None = None  # see use_predictor_graphs
        self.requires_grad_(False)

    # ---- loading ----------------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> "TalkerModel":
        cfg = load_config(ckpt_dir)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # build in the target dtype and device: no float32 copy
        try:
            with torch.device(device):
                model = cls(cfg)
        finally:
            torch.set_default_dtype(previous)
        model.load(load_state_dict(ckpt_dir, "talker", dtype=dtype), thinker_token_rows(ckpt_dir, model.tts_token_ids))
        return model.eval()

    @property
    def tts_token_ids(self) -> tuple[int, int, int]:
        return (self.ids.tts_bos, self.ids.tts_eos, self.ids.tts_pad)

    def load(self, tensors, tts_thinker_rows: torch.Tensor) -> None:
        """`tensors`: checkpoint names under `talker.` (prefix stripped); `tts_thinker_rows`:
        the thinker's input embeddings of tts_bos, tts_eos, tts_pad ([3, thinker H])."""
        load_weights(self, tensors, "")
        ties = self.router_ties()
        if ties:
            log.warning("talker router rows repeat (layer: tied experts) %s: expert choice is a top-k tie "
                        "broken differently on CPU and CUDA, so codes will differ by device", ties)
        with torch.no_grad():
            rows = tts_thinker_rows.to(self.tts_embeds.device, self.tts_embeds.dtype)
            self.tts_embeds.copy_(self.text_projection(rows))

    def router_ties(self) -> dict[int, int]:
        """{layer: experts whose router row repeats another's} (see `tied_router_experts`)."""
        counts = {i: tied_router_experts(layer.mlp.gate.weight) for i, layer in enumerate(self.model.layers)}
        return {i: n for i, n in counts.items() if n}

    def parts(self) -> TalkerParts:
        return TalkerParts(
            text_projection=self._no_grad(self.text_projection),
            hidden_projection=self._no_grad(self.hidden_projection),
            codec_embed=self._no_grad(self.model.codec_embedding),
            tts_embeds=self.tts_embeds,
        )

    def _no_grad(self, module: nn.Module):
        param = next(module.parameters())

        def run(x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                x = x.to(param.device)
                return module(x.to(param.dtype) if x.is_floating_point() else x)

        return run

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

    def prepare(self, seq, inputs: dict[str, Any]) -> None:
        req = inputs.get("talker")
        if not isinstance(req, TalkerRequest) or req.inputs.prefill is None:
            raise InvalidRequest("talker sequences need a TalkerRequest whose prefill is built")
        if len(seq.prompt_token_ids) != req.prefill_len:
            raise InvalidRequest("talker prompt length differs from its prefill rows")
        seq.model_state["talker"] = req

    def positions(self, seq, start: int, end: int) -> torch.Tensor:
        """[3, end - start] float32: the prefill's (M-)RoPE positions, then index + delta."""
        inputs = seq.model_state["talker"].inputs
        n = inputs.positions.shape[1]
        parts = []
        if start < n:
            parts.append(inputs.positions[:, start : min(end, n)])
        if end > n:
            tail = torch.arange(max(start, n), end, dtype=torch.float32) + inputs.delta
            parts.append(tail.expand(3, -1))
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

    def prefix_key(self, seq, start: int, end: int) -> bytes | None:
        """A user-part block: the bytes of its source thinker rows, their kind and rope positions."""
        inputs = seq.model_state["talker"].inputs
        source = inputs.user_source
        if source is None or end > source.shape[0]:
            return None  # the assistant part and the frames
        h = blake2b(inputs.positions[:, start:end].contiguous().numpy().tobytes(), digest_size=16)
        h.update(inputs.user_is_media[start:end])
        h.update(source[start:end].view(torch.uint8).numpy().tobytes())
        return h.digest()

    def input_embeds(self, seq, start: int, end: int) -> torch.Tensor:
        req: TalkerRequest = seq.model_state["talker"]
        n = req.prefill_len
        rows = []
        if start < n:
            rows.append(req.inputs.prefill[start : min(end, n)])
        for pos in range(max(start, n), end):
            k = pos - n
            rows.append((req.frame_embeds[k] + req.inputs.trailing(k))[None])
        return torch.cat(rows) if len(rows) > 1 else rows[0]

    def input_ready(self, seq) -> bool:
        req: TalkerRequest = seq.model_state["talker"]
        k = seq.num_tokens - 1 - req.prefill_len  # frame index of the newest position
        return k < 0 or req.inputs.trailing(k) is not None

    def logits_processors(self) -> list:
        """The codec specials are never sampled (codec EOS excepted)."""
        return [SuppressTokens(self.suppress_token_ids, self.text_cfg.vocab_size, self.codec_head.weight.device)]

    @torch.inference_mode()
    def after_sample(self, seqs, tokens: torch.Tensor, hidden: torch.Tensor) -> list[dict]:
        """The code predictor fills groups 1..G-1 for every row while the codes stay on the
        device; one copy brings all codes to the host, and only rows that go on keep a frame."""
        reqs: list[TalkerRequest] = [seq.model_state["talker"] for seq in seqs]
        code0 = tokens.clamp_min(0)  # -1: a non-finite row, failed by the engine
        code0_embed = self.model.codec_embedding(code0)
        codes, embeds = self._predict_codes(hidden.to(code0_embed.dtype), code0_embed, reqs)
        frames = torch.cat((code0_embed[:, None], embeds), dim=1).sum(1)
        host = torch.cat((tokens[:, None], code0[:, None], codes), dim=1).cpu()
        sampled, all_codes = host[:, 0].tolist(), host[:, 1:]
        extras: list[dict] = [{} for _ in seqs]
        for i, (seq, req) in enumerate(zip(seqs, reqs)):
            if sampled[i] >= 0 and self._goes_on(seq, sampled[i]):
                req.frame_embeds.append(frames[i])
                extras[i] = {"codes": all_codes[i]}
        return extras

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
                       reqs: list[TalkerRequest]) -> tuple[torch.Tensor, torch.Tensor]:
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

    def _goes_on(self, seq, token: int) -> bool:
        """False when `token` ends the sequence (no frame is computed for it then)."""
        if token == self.ids.codec_eos or token in seq.params.stop_token_ids:
            return False
        if len(seq.output_token_ids) + 1 >= seq.params.max_tokens:
            return False
        return self.max_model_len is None or seq.num_tokens + 1 <= self.max_model_len

    def release(self, seq) -> None:
        seq.model_state.clear()

    # ---- requests -----------------------------------------------------------------------
    def new_request(self, speaker: str, greedy: bool, seed: int | None, prompt_ids: list[int] | None = None) -> TalkerRequest:
        """`seed` None: a random one (the code predictor's draws still hash per frame and group)."""
        predictor_seed = (int(seed) + 1) if seed is not None else random.getrandbits(31)
        return TalkerRequest(TalkerInputs(self.ids, self.parts(), speaker, prompt_ids), greedy, predictor_seed)


def thinker_token_rows(ckpt_dir: str | Path, token_ids: tuple[int, ...]) -> torch.Tensor:
    """Rows of the thinker's input embedding table, read without loading the whole table."""
    from safetensors import safe_open

    name = "thinker.model.embed_tokens.weight"
    files = checkpoint_files(ckpt_dir)
    if name not in files:
        raise CheckpointError(f"{ckpt_dir}: no {name} (the talker needs the tts token embeddings)")
    with safe_open(str(files[name]), framework="pt") as f:
        table = f.get_slice(name)
        vocab = table.get_shape()[0]
        for t in token_ids:
            if not 0 <= t < vocab:
                raise CheckpointError(f"tts token id {t} outside the thinker vocabulary of {vocab}")
        return torch.cat([table[t : t + 1] for t in token_ids]).float()
