"""Qwen3-Omni's code2wav vocoder (codec frames -> 24 kHz PCM): the shared streaming decoder
(`omni.layers.codec.wave_decoder`) behind code2wav's own front, an averaged embedding of the
16 codebooks. Module names follow the checkpoint so weights load by name under `code2wav.`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from omni.layers.codec.streaming_layers import StreamBatch
from omni.layers.codec.wave_decoder import StreamingWaveDecoder
from omni.models.qwen3_omni.config import Code2WavConfig, load_config
from omni.models.weights import CheckpointError, load_module

PREFIX = "code2wav"


class Code2Wav(StreamingWaveDecoder):
    """Module names follow the checkpoint so weights load by name under `code2wav.`."""

    def __init__(self, cfg: Code2WavConfig):
        super().__init__(cfg, cfg.hidden_size)

    def build_embedding(self) -> None:
        cfg = self.cfg
        self.code_embedding = nn.Embedding(cfg.codebook_size * cfg.num_quantizers, cfg.hidden_size)
        self.register_buffer(
            "code_offset", torch.arange(cfg.num_quantizers).view(1, -1, 1) * cfg.codebook_size, persistent=False
        )

    def embed(self, codes: torch.Tensor, st: StreamBatch) -> torch.Tensor:
        return self.code_embedding(codes + self.code_offset).mean(1)

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path, dtype=None, device: str = "cpu") -> "Code2Wav":
        cfg = load_config(ckpt_dir).code2wav
        if cfg is None:
            raise CheckpointError(f"{ckpt_dir} has no audio output (no code2wav)")
        return load_module(lambda: cls(cfg), ckpt_dir, PREFIX, dtype, device)
