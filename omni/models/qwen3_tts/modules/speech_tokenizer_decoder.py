"""The 12 Hz speech tokenizer's decoder (codes [B, Q, T] -> 24 kHz PCM), streaming and batched.

It is Qwen3-Omni's code2wav with another front: a split residual VQ (one semantic codebook, the
rest acoustic, each half with a 1x1 output projection) and a causal conv (`pre_conv`) instead of
code2wav's averaged embedding, pre-transformer in/out projections, and transposed convs trimmed
on the right only. So the streaming machinery is the shared one (`omni.layers.codec`'s
`StreamingWaveDecoder`): each layer keeps its own left context and T frames give exactly T * 1920
samples, as the full decode has them.

The reference decodes more than 300 frames in 300-frame windows with 25 frames of left context,
an approximation of this full causal decode; up to 300 frames the two are the same computation.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from omni.layers.codec.streaming_layers import CausalConv, StreamBatch
from omni.layers.codec.wave_decoder import StreamingWaveDecoder
from omni.models.qwen3_tts.modules.speech_tokenizer import DecoderConfig, load_tokenizer_config
from omni.models.weights import INDEX_FILE, SINGLE_FILE, CheckpointError, load_into

PREFIX = "decoder"
CODEBOOK_EPS = 1e-5


class Codebook(nn.Module):
    """EMA codebook as stored: entries = embedding_sum / max(cluster_usage, eps)."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def entries(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=CODEBOOK_EPS)[:, None]


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class _VQLayers(nn.Module):
    def __init__(self, n: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList([_VQ(size, dim) for _ in range(n)])


class ResidualVQ(nn.Module):
    """n codebooks of width dim // 2, summed, then projected to dim. `input_proj` is the encode
    side's: in the checkpoint, unused when decoding."""

    def __init__(self, n: int, size: int, dim: int):
        super().__init__()
        self.input_proj = nn.Conv1d(dim, dim // 2, 1, bias=False)
        self.output_proj = nn.Conv1d(dim // 2, dim, 1, bias=False)
        self.vq = _VQLayers(n, size, dim // 2)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, n, T] -> [B, dim, T]."""
        quantized = None
        for i, layer in enumerate(self.vq.layers):
            q = F.embedding(codes[:, i], layer._codebook.entries())
            quantized = q if quantized is None else quantized + q
        return self.output_proj(quantized.transpose(1, 2))


class SplitResidualVQ(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.rvq_first = ResidualVQ(1, cfg.codebook_size, cfg.codebook_dim)
        self.rvq_rest = ResidualVQ(cfg.num_quantizers - 1, cfg.codebook_size, cfg.codebook_dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


class SpeechTokenizerDecoder(StreamingWaveDecoder):
    """A `StreamingCodec` (omni/stages/vocoder.py). Module names follow the checkpoint (`decoder.`)."""

    def __init__(self, cfg: DecoderConfig):
        if cfg.num_quantizers < 2:
            raise CheckpointError(f"the speech tokenizer decoder needs >= 2 quantizers, has {cfg.num_quantizers}")
        super().__init__(cfg, cfg.latent_dim, io_dim=cfg.latent_dim, trim_left=False)

    def build_embedding(self) -> None:
        self.quantizer = SplitResidualVQ(self.cfg)
        self.pre_conv = CausalConv(self.cfg.codebook_dim, self.cfg.latent_dim, 3)

    def embed(self, codes: torch.Tensor, st: StreamBatch) -> torch.Tensor:
        return self.pre_conv(self.quantizer.decode(codes), st).transpose(1, 2)

    @classmethod
    def from_dir(cls, tokenizer_dir: str | Path, dtype=None, device: str = "cpu", seed: int = 0
                 ) -> "SpeechTokenizerDecoder":
        """Load `tokenizer_dir` (a speech_tokenizer folder); one without safetensors (a full-size
        benchmark preset) gets random weights drawn on `device`."""
        cfg = load_tokenizer_config(tokenizer_dir).decoder
        with torch.device(device):
            model = cls(cfg)
        if has_weights(tokenizer_dir):
            load_into(model, tokenizer_dir, PREFIX, dtype=dtype, device=device)
        else:
            from omni.models.qwen3_tts.modules.random_init import init_decoder_

            init_decoder_(model, seed)
            if dtype is not None:
                model.to(dtype=dtype)
        return model.eval()


def has_weights(tokenizer_dir: str | Path) -> bool:
    root = Path(tokenizer_dir)
    return (root / SINGLE_FILE).is_file() or (root / INDEX_FILE).is_file()
