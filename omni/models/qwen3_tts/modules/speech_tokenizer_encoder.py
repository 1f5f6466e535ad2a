"""The 12 Hz speech tokenizer's encoder (24 kHz PCM -> codes [T, Q]): the Mimi encode path.

SEANet (causal convs, ELU, residual blocks, strided downsampling) -> a causal transformer ->
a strided conv to 12.5 Hz -> split residual VQ (one semantic codebook quantizing the latents,
the acoustic codebooks quantizing them again on their own), of which the first Q codes per frame
are kept. Module names follow the published checkpoint (`encoder.` in model.safetensors; its
flat Mimi layout). The reference runs Mimi's attention fully causal (the window at
max_position_embeddings), as here.

A clip is encoded alone: its last frames depend on how its length pads the strided convs, so
clips padded into one batch would not give each its own codes.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from omni.layers.norms import LayerScale
from omni.models.qwen3_tts.modules.speech_tokenizer import EncoderConfig, load_tokenizer_config
from omni.models.weights import load_into
from omni.layers.attention import sdpa

PREFIX = "encoder"
CODEBOOK_EPS = 1e-5


class CausalPadConv(nn.Module):
    """Mimi's causal Conv1d: left pad (kernel - stride), right pad to a whole number of strides."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1, bias: bool = True,
                 pad_mode: str = "constant"):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride, dilation=dilation, bias=bias)
        self.stride = stride
        self.kernel = (kernel - 1) * dilation + 1
        self.pad = self.kernel - stride
        self.pad_mode = pad_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        frames = math.ceil((length - self.kernel + self.pad) / self.stride + 1) - 1
        extra = frames * self.stride + self.kernel - self.pad - length
        if self.pad_mode == "constant":
            x = F.pad(x, (self.pad, extra), "constant", 0.0)
        else:
            x = F.pad(x, (self.pad, extra), self.pad_mode)
        return self.conv(x)


class ResnetBlock(nn.Module):
    def __init__(self, cfg: EncoderConfig, dim: int, dilation: int):
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList([
            nn.ELU(), CausalPadConv(dim, hidden, cfg.residual_kernel_size, dilation=dilation, pad_mode=cfg.pad_mode),
            nn.ELU(), CausalPadConv(hidden, dim, 1, pad_mode=cfg.pad_mode),
        ])
        self.shortcut = CausalPadConv(dim, dim, 1, pad_mode=cfg.pad_mode) if cfg.use_conv_shortcut else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for layer in self.block:
            h = layer(h)
        return (x if self.shortcut is None else self.shortcut(x)) + h


class SEANetEncoder(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        layers: list[nn.Module] = [CausalPadConv(cfg.audio_channels, cfg.num_filters, cfg.kernel_size,
                                                 pad_mode=cfg.pad_mode)]
        scale = 1
        for ratio in reversed(cfg.upsampling_ratios):
            dim = scale * cfg.num_filters
            layers += [ResnetBlock(cfg, dim, cfg.dilation_growth_rate ** j) for j in range(cfg.num_residual_layers)]
            layers += [nn.ELU(), CausalPadConv(dim, dim * 2, ratio * 2, stride=ratio, pad_mode=cfg.pad_mode)]
            scale *= 2
        layers += [nn.ELU(), CausalPadConv(scale * cfg.num_filters, cfg.hidden_size, cfg.last_kernel_size,
                                           pad_mode=cfg.pad_mode)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = sdpa(q, k, v, is_causal=True, scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        if cfg.hidden_act != "gelu":
            raise ValueError(f"speech tokenizer encoder: hidden_act {cfg.hidden_act!r} is not served (gelu is)")
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class EncoderTransformer(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.layers = nn.ModuleList([TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float) / cfg.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, hidden] -> [B, T, hidden], causal."""
        freqs = torch.arange(x.shape[1], device=x.device)[:, None].float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))

    def entries(self) -> torch.Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=CODEBOOK_EPS)[:, None]

    def nearest(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, dim] -> index of the nearest entry (Euclidean) [N]."""
        return torch.cdist(x[None].float(), self.entries()[None].float(), p=2)[0].argmin(dim=-1)


class _Quantizer(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.codebook = Codebook(size, dim)


class ResidualVQ(nn.Module):
    """`n` of the checkpoint's codebooks (the rest are never used: only the first Q codes are kept)."""

    def __init__(self, cfg: EncoderConfig, n: int):
        super().__init__()
        dim = cfg.vector_quantization_hidden_dimension
        self.input_proj = nn.Conv1d(cfg.hidden_size, dim, 1, bias=False) if dim != cfg.hidden_size else None
        self.layers = nn.ModuleList([_Quantizer(cfg.codebook_size, cfg.codebook_dim) for _ in range(n)])

    def encode(self, latents: torch.Tensor) -> torch.Tensor:
        """[B, hidden, T] -> codes [B, n, T]."""
        residual = latents if self.input_proj is None else self.input_proj(latents)
        codes = []
        for layer in self.layers:
            flat = residual.permute(0, 2, 1)
            idx = layer.codebook.nearest(flat.reshape(-1, flat.shape[-1])).view(flat.shape[:-1])
            residual = residual - F.embedding(idx, layer.codebook.entries()).permute(0, 2, 1)
            codes.append(idx)
        return torch.stack(codes, dim=1)


class SplitResidualVQ(nn.Module):
    def __init__(self, cfg: EncoderConfig, keep: int):
        super().__init__()
        semantic = cfg.num_semantic_quantizers
        if keep <= semantic:
            raise ValueError(f"keeping {keep} codes needs more than the {semantic} semantic quantizers")
        self.semantic_residual_vector_quantizer = ResidualVQ(cfg, semantic)
        self.acoustic_residual_vector_quantizer = ResidualVQ(cfg, keep - semantic)

    def encode(self, latents: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.semantic_residual_vector_quantizer.encode(latents),
                          self.acoustic_residual_vector_quantizer.encode(latents)], dim=1)


class SpeechTokenizerEncoder(nn.Module):
    def __init__(self, cfg: EncoderConfig, keep: int):
        super().__init__()
        self.cfg = cfg
        self.num_quantizers = keep  # codes per frame it gives
        self.encoder = SEANetEncoder(cfg)
        self.encoder_transformer = EncoderTransformer(cfg)
        self.downsample = CausalPadConv(cfg.hidden_size, cfg.hidden_size, 2 * cfg.latent_stride,
                                        stride=cfg.latent_stride, bias=False, pad_mode="replicate")
        self.quantizer = SplitResidualVQ(cfg, keep)

    @classmethod
    def from_dir(cls, tokenizer_dir: str | Path, dtype=None, device: str = "cpu", seed: int = 0
                 ) -> "SpeechTokenizerEncoder":
        """Load `tokenizer_dir`; one without safetensors (a full-size benchmark preset) gets random
        weights. The checkpoint's decoding-side Mimi tensors (output projections, the unkept
        codebooks) are not loaded."""
        from omni.models.qwen3_tts.modules.speech_tokenizer_decoder import has_weights

        full = load_tokenizer_config(tokenizer_dir)
        with torch.device(device):
            model = cls(full.encoder, full.valid_quantizers)
        if has_weights(tokenizer_dir):
            load_into(model, tokenizer_dir, PREFIX, dtype=dtype, device=device, allow_unused=True)
        else:
            from omni.models.qwen3_tts.modules.random_init import init_encoder_

            init_encoder_(model, seed)
            if dtype is not None:
                model.to(dtype=dtype)
        return model.eval()

    @property
    def sample_rate(self) -> int:
        return self.cfg.sampling_rate

    @property
    def hop(self) -> int:
        return self.cfg.hop

    @torch.inference_mode()
    def encode(self, pcm: np.ndarray) -> np.ndarray:
        """One clip, mono float32 at `sample_rate` -> codes int64 [ceil(n / hop), Q]."""
        p = next(self.parameters())
        x = torch.as_tensor(np.asarray(pcm, dtype=np.float32), device=p.device).to(p.dtype)[None, None]
        latents = self.encoder(x)
        latents = self.encoder_transformer(latents.transpose(1, 2)).transpose(1, 2)
        codes = self.quantizer.encode(self.downsample(latents))[0]
        frames = -(-len(pcm) // self.hop)
        return codes[:, :frames].T.contiguous().cpu().numpy().astype(np.int64)
