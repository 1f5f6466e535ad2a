"""The Qwen3-TTS talker as an AR-engine model: the shared multi-codebook talker over a dense decoder.

Everything per step is the shared talker's (`omni.stages.codec_lm.CodecLM`: forward over the
paged cache, codec head, the code predictor filling groups 1..G-1 right after each group-0
sample, frame sums fed back with the trailing text row, CUDA graphs of the predictor); what
differs is built here:
  - each layer's MLP is a dense SwiGLU (no experts);
  - the talker owns its text embedding table and `text_projection` (no thinker), and the
    prompt rows come from `prompt.build_prompt`, not from thinker states;
  - the code predictor embeds codes at the talker's width and projects them down
    (`small_to_mtp_projection`) when its own width is smaller (1.7B);
  - positions are plain (every M-RoPE axis carries the same index), so no prefix caching by
    thinker rows: a TTS prompt is cheap to recompute.
Weights are read from the reference's names under `talker.`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from omni.kernel.errors import InvalidRequest
from omni.layers.attention import QKVProjection
from omni.layers.mlp import MLP, GatedMLP
from omni.layers.norms import RMSNorm
from omni.layers.rotary import DEFAULT_MROPE_SECTION, rope_inv_freq
from omni.models.qwen3_tts.config import Qwen3TTSConfig, load_config
from omni.models.qwen3_tts.modules.prompt import PromptEmbedders, PromptSpec, build_prompt
from omni.models.weights import load_state_dict, load_weights
from omni.stages.codec_lm.code_predictor import CodePredictor
from omni.stages.codec_lm.model import SUPPRESSED_SPAN, CodecLM
from omni.stages.codec_lm.request import STATE_KEY, CodecLMRequest


@dataclass(frozen=True)
class _Ids:
    """The ids the shared talker code reads (`codec_eos`, `codec_pad`)."""

    codec_eos: int
    codec_pad: int


class _Layer(nn.Module):
    def __init__(self, c) -> None:
        super().__init__()
        bias = bool(c.raw.get("attention_bias", False))
        self.self_attn = QKVProjection(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps, bias)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class _Decoder(nn.Module):
    """`talker.model.*`: layers, final norm, codec and text embedding tables."""

    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__()
        c = cfg.talker
        self.layers = nn.ModuleList(_Layer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.codec_embedding = nn.Embedding(c.vocab_size, c.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)


class TTSTalkerModel(CodecLM):
    """`CodecLM`'s engine interface over the Qwen3-TTS talker (see the module docstring)."""

    # the code predictor's filters when it samples (generation_config's subtalker_top_k / _top_p)
    predictor_top_k, predictor_top_p = 50, 1.0

    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        nn.Module.__init__(self)  # the parts CodecLM steps with are built here
        c = cfg.talker
        self.cfg, self.text_cfg = cfg, c
        self.ids = _Ids(cfg.codec.eos, cfg.codec.pad)
        self.num_code_groups = cfg.num_code_groups
        self.model = _Decoder(cfg)
        self.codec_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.text_projection = MLP(cfg.text_hidden_size, cfg.text_hidden_size, c.hidden_size)
        self.code_predictor = CodePredictor(cfg.code_predictor, cfg.num_code_groups, embed_dim=c.hidden_size)
        self.inv_freq = rope_inv_freq(c.head_dim, c.rope_theta)
        self.mrope_section = tuple(c.mrope_section) or DEFAULT_MROPE_SECTION
        # the reference suppresses [vocab - 1024, vocab) but codec EOS
        self.suppress_token_ids = tuple(
            i for i in range(max(0, c.vocab_size - SUPPRESSED_SPAN), c.vocab_size) if i != cfg.codec.eos
        )
        self.placeholder_id = cfg.codec.pad if cfg.codec.pad in self.suppress_token_ids else self.suppress_token_ids[-1]
        self.max_model_len: int | None = None
        self.predictor_graphs = None
        self.requires_grad_(False)

    # ---- loading ----------------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> "TTSTalkerModel":
        cfg = load_config(ckpt_dir)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                model = cls(cfg)
        finally:
            torch.set_default_dtype(previous)
        model.load(load_state_dict(ckpt_dir, "talker", dtype=dtype))
        return model.eval()

    def load(self, tensors) -> None:
        """`tensors`: checkpoint names under `talker.` (prefix stripped)."""
        load_weights(self, tensors, "")

    def prefix_key(self, seq, start: int, end: int) -> bytes | None:
        return None

    def prepare(self, seq, inputs) -> None:
        req = inputs.get(STATE_KEY)
        if not isinstance(req, CodecLMRequest):
            raise InvalidRequest("TTS talker sequences need a CodecLMRequest")
        if len(seq.prompt_token_ids) != req.prefill_len:
            raise InvalidRequest("talker prompt length differs from its prefill rows")
        seq.model_state[STATE_KEY] = req

    # ---- prompts ----------------------------------------------------------------------
    def embedders(self) -> PromptEmbedders:
        return PromptEmbedders(text=self.embed_text, codec=self.model.codec_embedding, frames=self.frame_sums)

    @torch.no_grad()
    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        return self.text_projection(self.model.text_embedding(ids))

    @torch.no_grad()
    def frame_sums(self, codes: torch.Tensor) -> torch.Tensor:
        """[T, G] codes -> [T, H]: the sum of each frame's group embeddings (a reference frame)."""
        if codes.ndim != 2 or codes.shape[1] != self.num_code_groups:
            raise InvalidRequest(f"reference codes must be [frames, {self.num_code_groups}], got {tuple(codes.shape)}")
        tables = [self.model.codec_embedding, *self.code_predictor.model.codec_embedding]
        return torch.stack([table(codes[:, g]) for g, table in enumerate(tables)], dim=1).sum(1)

    @torch.no_grad()
    def new_tts_request(self, spec: PromptSpec, greedy: bool, seed: int | None,
                        predictor_temperature: float = 0.9) -> CodecLMRequest:
        device = self.codec_head.weight.device
        if spec.spk_embedding is not None:
            spec.spk_embedding = torch.as_tensor(spec.spk_embedding).to(device, self.codec_head.weight.dtype)
            if spec.spk_embedding.numel() != self.text_cfg.hidden_size:
                raise InvalidRequest(f"speaker embedding has {spec.spk_embedding.numel()} values, the talker "
                                     f"takes {self.text_cfg.hidden_size}")
        if spec.ref_codes is not None:
            spec.ref_codes = torch.as_tensor(spec.ref_codes, dtype=torch.long).to(device)
            if int(spec.ref_codes.min()) < 0 or int(spec.ref_codes.max()) >= self.code_predictor.spec.vocab_size:
                raise InvalidRequest("reference codes are outside the codebook")
        prompt = build_prompt(self.cfg, spec, self.embedders(), device)
        predictor_seed = (int(seed) + 1) if seed is not None else random.getrandbits(31)
        return CodecLMRequest(prompt, greedy, predictor_seed, predictor_temperature=predictor_temperature)
