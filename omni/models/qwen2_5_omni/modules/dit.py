"""Qwen2.5-Omni's token2wav DiT: the velocity field of a flow from noise to mel, given codec tokens
and a speaker (a conditioning vector and a reference mel, encoded by ECAPA).

The conditioning part of the input (speaker, reference-mel encoding, code embedding) does not change
along the ODE, so `features` computes it once per window and `velocity` only joins it to the moving
mel. Rows are independent (per-row time steps), so windows of several requests at different ODE
steps, and the conditional and null rows of guidance, share one forward. Names follow the
reference checkpoint (under `token2wav.code2wav_dit_model.`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni.layers.ecapa import ECAPA
from omni.layers.fused_linear import fuse_linears, still_fused
from omni.layers.rotary import rope_cos_sin, rope_inv_freq
from omni.models.qwen2_5_omni.config import DiTConfig
from omni.models.qwen2_5_omni.modules.dit_layers import AdaNorm, BlockWindows, DiTBlock, TimestepEmbedding, modulate


class CodecEmbedding(nn.Module):
    def __init__(self, num_embeds: int, dim: int, repeats: int):
        super().__init__()
        self.repeats = repeats
        self.codec_embed = nn.Embedding(num_embeds + 1, dim)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """[N, tokens] -> [N, tokens * repeats, dim]."""
        return torch.repeat_interleave(self.codec_embed(codes), repeats=self.repeats, dim=1)


class InputEmbedding(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.mel_dim + cfg.enc_dim + cfg.enc_emb_dim + cfg.emb_dim, cfg.hidden_size)
        self.spk_encoder = ECAPA(cfg)


class DiT(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        self.time_embed = TimestepEmbedding(cfg.hidden_size)
        self.text_embed = CodecEmbedding(cfg.num_embeds, cfg.emb_dim, cfg.repeats)
        self.input_embed = InputEmbedding(cfg)
        self.transformer_blocks = nn.ModuleList([
            DiTBlock(cfg, int(i in cfg.look_backward_layers), int(i in cfg.look_ahead_layers))
            for i in range(cfg.num_hidden_layers)
        ])
        self.norm_out = AdaNorm(cfg.hidden_size, 2)
        self.proj_out = nn.Linear(cfg.hidden_size, cfg.mel_dim)
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)
        self.modulation: nn.Linear | None = None  # every block's AdaNorm and norm_out's as one GEMM (CUDA)

    def _adanorms(self) -> list[nn.Linear]:
        return [b.attn_norm.linear for b in self.transformer_blocks] + [self.norm_out.linear]

    def fuse_projections(self) -> bool:
        """All modulation parameters of a forward from one GEMM over silu(time embedding) (they read the
        same input; `fused_linear.fuse_model_projections` calls this on CUDA)."""
        if not still_fused(self.modulation, *self._adanorms()):
            self.modulation = fuse_linears(*self._adanorms())
        return self.modulation is not None

    def _modulations(self, emb: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        """Each block's six parameter sets, then norm_out's two."""
        act = F.silu(emb)
        if self.modulation is None:
            return [b.attn_norm.params_of(act) for b in self.transformer_blocks] + [self.norm_out.params_of(act)]
        sizes = [lin.out_features for lin in self._adanorms()]
        parts = self.modulation(act).split(sizes, dim=1)
        chunks = [b.attn_norm.chunks for b in self.transformer_blocks] + [self.norm_out.chunks]
        return [torch.chunk(p, c, dim=1) for p, c in zip(parts, chunks)]

    @property
    def context_blocks(self) -> tuple[int, int]:
        """Blocks one forward sees behind and ahead of a frame's own block."""
        return len(self.cfg.look_backward_layers), len(self.cfg.look_ahead_layers)

    def encode_speaker(self, ref_mel: torch.Tensor) -> torch.Tensor:
        """ref_mel [N, T_ref, mel_dim] -> [N, enc_dim] (the same for every window of a stream)."""
        return self.input_embed.spk_encoder(ref_mel)

    def features(self, codes: torch.Tensor, spk: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """codes [N, tokens], spk [N, enc_dim] (`encode_speaker`), cond [N, enc_emb_dim] -> the fixed
        part of the input, [N, tokens * repeats, enc_dim + emb_dim + enc_emb_dim]. A null row
        (guidance) has codes 0, cond 0 and the encoding of a zero ref_mel, as the reference drops them."""
        code = self.text_embed(codes)
        frames = code.shape[1]
        return torch.cat((spk.unsqueeze(1).expand(-1, frames, -1), code,
                          cond.unsqueeze(1).expand(-1, frames, -1)), dim=-1)

    def velocity(self, x: torch.Tensor, t: torch.Tensor, feats: torch.Tensor,
                 lengths: torch.Tensor | None = None) -> torch.Tensor:
        """x [N, T, mel_dim] at times t [N], feats [N, T, F] -> d x / d t [N, T, mel_dim]. `lengths` [N]:
        each row's real frames, the rest padding at its end: no real frame attends to a padded one (a
        padded frame attends to itself too, so no row of the softmax is empty), so the real frames
        come out as the row alone gives them. Attention runs over windows of blocks (`BlockWindows`)."""
        emb = self.time_embed(t)
        h = self.input_embed.proj(torch.cat((x, feats), dim=-1))
        frames = x.shape[1]
        positions = torch.arange(frames, device=x.device)
        cos, sin = rope_cos_sin(self.inv_freq, positions, h.dtype)
        real = positions[None, :] < lengths[:, None] if lengths is not None else None
        spans: dict[tuple[int, int], BlockWindows] = {}
        *params, (scale, shift) = self._modulations(emb)
        for block, p in zip(self.transformer_blocks, params):
            span = (block.back, block.ahead)
            if span not in spans:
                spans[span] = BlockWindows(frames, self.cfg.block_size, *span, real, x.shape[0], h.dtype, x.device)
            h = block(h, p, cos, sin, spans[span])
        return self.proj_out(modulate(h, scale, shift))
