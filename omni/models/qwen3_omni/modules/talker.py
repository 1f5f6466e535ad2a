"""The Qwen3-Omni talker: the shared multi-codebook talker (`omni.stages.codec_lm.CodecLM`: the
step, the code predictor, the frame feedback, the stop rule) over a MoE decoder.

A talker sequence is: prefill rows built from the thinker's states (`talker_inputs`), then one
position per codec frame; a frame's input is its codes' embeddings plus the trailing text row
(thinker text, then tts_eos, then tts_pad).

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
from hashlib import blake2b
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omni.kernel.errors import InvalidRequest
from omni.layers.attention import QKVProjection
from omni.layers.configs import DecoderConfig
from omni.layers.fp8 import device_runs_fp8, resolve_state
from omni.layers.fp8_format import checkpoint_format
from omni.layers.fp8_modules import convert_shells_, quantize_at_load_
from omni.layers.mlp import MLP
from omni.layers.moe import SharedExpertMoE, tied_router_experts
from omni.layers.norms import RMSNorm
from omni.layers.rotary import DEFAULT_MROPE_SECTION, rope_inv_freq
from omni.models.qwen3_omni.checkpoint.make_tiny import TINY_MARKER
from omni.models.qwen3_omni.config import Qwen3OmniConfig, load_config
from omni.models.qwen3_omni.modules.talker_inputs import DeferredRows, TalkerInputs, TalkerParts, TalkerTokenIds
from omni.models.weights import CheckpointError, load_state_dict, load_weights, thinker_token_rows
from omni.stages.codec_lm.code_predictor import CodePredictor
from omni.stages.codec_lm.model import SUPPRESSED_SPAN, CodecLM
from omni.stages.codec_lm.request import STATE_KEY, CodecLMRequest

log = logging.getLogger("omni.talker")


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


class TalkerModel(CodecLM):
    """`CodecLM` over Qwen3-Omni's MoE talker, its prompt rows from the thinker's states."""

    deferred_rows: DeferredRows | None = None  # off until `defer_text_rows` (the stage, on CUDA)

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
        self.predictor_graphs = None  # see use_predictor_graphs
        self.requires_grad_(False)

    # ---- loading ----------------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu",
                        quantization: str = "") -> "TalkerModel":
        """FP8 decoder weights as the thinker's (`Qwen3OmniThinker.from_checkpoint`); the code predictor,
        heads, embeddings and projections stay in `dtype`."""
        cfg = load_config(ckpt_dir)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # build in the target dtype and device: no float32 copy
        try:
            with torch.device(device):
                model = cls(cfg)
        finally:
            torch.set_default_dtype(previous)
        fmt, keep = checkpoint_format(cfg.raw), device_runs_fp8(device)
        tensors = resolve_state(load_state_dict(ckpt_dir, "talker", dtype=dtype, fp8=True), fmt, dtype, keep,
                                where=f"{ckpt_dir} (talker)")
        convert_shells_(model, tensors)
        model.load(tensors, thinker_token_rows(ckpt_dir, model.tts_token_ids),
                   random_weights=(Path(ckpt_dir) / TINY_MARKER).is_file())
        quantize_at_load_(model, quantization, fmt, keep)
        return model.eval()

    @property
    def tts_token_ids(self) -> tuple[int, int, int]:
        return (self.ids.tts_bos, self.ids.tts_eos, self.ids.tts_pad)

    def load(self, tensors, tts_thinker_rows: torch.Tensor, random_weights: bool = False) -> None:
        """`tensors`: checkpoint names under `talker.` (prefix stripped); `tts_thinker_rows`:
        the thinker's input embeddings of tts_bos, tts_eos, tts_pad ([3, thinker H]). Tied router
        rows are worth a warning in a trained checkpoint only: a tiny random one has them by design."""
        load_weights(self, tensors, "")
        ties = self.router_ties()
        if ties:
            log.log(logging.INFO if random_weights else logging.WARNING, "talker router rows repeat (layer: tied experts) %s: expert choice is a top-k tie "
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
            deferred=self.deferred_rows,
        )

    def defer_text_rows(self, on: bool) -> None:
        """Project the trailing text rows of all requests together (`DeferredRows`; the stage turns it
        on for CUDA and flushes before each step). Requests made after the call follow it."""
        self.deferred_rows = DeferredRows(self._no_grad(self.text_projection)) if on else None

    def text_rows_waiting(self) -> bool:
        return self.deferred_rows is not None and bool(self.deferred_rows.pending)

    def flush_text_rows(self) -> None:
        if self.deferred_rows is not None:
            self.deferred_rows.flush()

    def _no_grad(self, module: nn.Module):
        param = next(module.parameters())

        def run(x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                x = x.to(param.device)
                return module(x.to(param.dtype) if x.is_floating_point() else x)

        return run

    # ---- ARModel (the rest is CodecLM's) ------------------------------------------------
    def prepare(self, seq, inputs: dict[str, Any]) -> None:
        req = inputs.get(STATE_KEY)
        if not isinstance(req, CodecLMRequest) or req.inputs.prefill is None:
            raise InvalidRequest("talker sequences need a CodecLMRequest whose prefill is built")
        if len(seq.prompt_token_ids) != req.prefill_len:
            raise InvalidRequest("talker prompt length differs from its prefill rows")
        seq.model_state[STATE_KEY] = req

    def prefix_key(self, seq, start: int, end: int) -> bytes | None:
        """A user-part block: the bytes of its source thinker rows, their kind and rope positions."""
        inputs = seq.model_state[STATE_KEY].inputs
        source = inputs.user_source
        if source is None or end > source.shape[0]:
            return None  # the assistant part and the frames
        h = blake2b(inputs.positions[:, start:end].contiguous().numpy().tobytes(), digest_size=16)
        h.update(inputs.user_is_media[start:end])
        h.update(source[start:end].view(torch.uint8).numpy().tobytes())
        return h.digest()

    # ---- requests -----------------------------------------------------------------------
    def new_request(self, speaker: str, greedy: bool, seed: int | None,
                    prompt_ids: list[int] | None = None) -> CodecLMRequest:
        """`seed` None: a random one (the code predictor's draws still hash per frame and group)."""
        predictor_seed = (int(seed) + 1) if seed is not None else random.getrandbits(31)
        return CodecLMRequest(TalkerInputs(self.ids, self.parts(), speaker, prompt_ids), greedy, predictor_seed)
