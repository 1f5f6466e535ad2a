"""Qwen2.5-Omni's audio encoder (weights under `thinker.audio_tower.`) in omni's code.

Log-mels are cut into chunks of 2*n_window frames; each chunk goes through conv1 (stride 1) and conv2
(stride 2) with its own sinusoidal positions, and attends only within itself. The valid rows of an
audio are then average-pooled in pairs (a trailing odd row is dropped), normed and projected to the
thinker's width. Padding never reaches a valid row (conv1's padded outputs are zeroed, as in
transformers), so an audio's rows do not depend on what it is batched with beyond rounding; chunks
pad to the longest of the call, as transformers' do.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from omni.kernel.errors import InvalidRequest
from omni.layers.transformer import AudioEncoderLayer, input_digest, sinusoids
from omni.models.qwen2_5_omni.config import AudioEncoderConfig, load_omni_config
from omni.models.weights import load_module

PREFIX = "thinker.audio_tower"


def token_count(frames: int) -> int:
    """Rows the encoder gives for `frames` mel frames (conv2's stride, then the pair pooling)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def chunk_lengths(frames: int, n_window: int) -> list[int]:
    chunk = 2 * n_window
    return [chunk] * (frames // chunk) + ([frames % chunk] if frames % chunk else [])


class AudioEncoder(nn.Module):
    def __init__(self, cfg: AudioEncoderConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.conv1 = nn.Conv1d(cfg.num_mel_bins, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.audio_bos_eos_token = nn.Embedding(2, cfg.output_dim)  # in the checkpoint, unused by the reference
        self.layers = nn.ModuleList([AudioEncoderLayer(cfg.d_model, cfg.num_heads, cfg.ffn_dim, k_bias=False)
                                     for _ in range(cfg.num_layers)])
        self.ln_post = nn.LayerNorm(d)
        self.proj = nn.Linear(d, cfg.output_dim)
        self.register_buffer("positions", sinusoids(cfg.max_source_positions, d), persistent=False)

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path, dtype=None, device: str = "cpu") -> "AudioEncoder":
        return load_module(lambda: cls(load_omni_config(ckpt_dir).thinker.audio), ckpt_dir, PREFIX, dtype, device)

    @torch.inference_mode()
    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """features: [num_mel_bins, frames_i] per audio -> [token_count(frames_i), output_dim] per audio."""
        lengths = [int(f.shape[-1]) for f in features]
        if not features or min(lengths) < 1:
            raise ValueError("every audio needs at least one feature frame")
        sizes = [chunk_lengths(n, self.cfg.n_window) for n in lengths]
        longest = max(max(s) for s in sizes)
        chunks, valid = [], []
        for f, per in zip(features, sizes):
            start = 0
            for size in per:
                chunks.append(F.pad(f[:, start:start + size], (0, longest - size)))
                valid.append(size)
                start += size
        dtype = self.conv1.weight.dtype
        x = torch.stack(chunks).to(dtype)
        frame_mask = (torch.arange(longest, device=x.device)[None, :] < torch.tensor(valid, device=x.device)[:, None])
        x = F.gelu(self.conv1(x)) * frame_mask[:, None, :].to(dtype)
        x = F.gelu(self.conv2(x)).transpose(1, 2)  # [chunks, rows, d]
        x = x + self.positions[: x.shape[1]].to(x.dtype)
        rows = [(v - 1) // 2 + 1 for v in valid]
        mask = torch.arange(x.shape[1], device=x.device)[None, :] < torch.tensor(rows, device=x.device)[:, None]
        for layer in self.layers:
            x = layer(x, mask)
        out, i = [], 0
        for per in sizes:
            h = torch.cat([x[i + j, : rows[i + j]] for j in range(len(per))])
            i += len(per)
            pairs = (h.shape[0] - 2) // 2 + 1
            h = (h[0 : 2 * pairs : 2] + h[1 : 2 * pairs : 2]) / 2
            out.append(self.proj(self.ln_post(h)))
        return out


class AudioFeaturesEncoder:
    """`BatchEncoder` for the encoder stage. Item: {"features": [mel_bins, frames] float32}. Output:
    {"audio_embeds": [tokens, output_dim]} and {"audio_keys": [tokens, 16] uint8} (each row keyed by
    the features that decided it, for the thinker's prefix cache). Chunks pad to the longest of a
    batch, so items batch by their longest chunk (equal keys: the rows transformers gives the audio alone)."""

    def __init__(self, model: AudioEncoder):
        self.model = model

    def batch_key(self, item: dict) -> int:
        features = item.get("features")
        bins = self.model.cfg.num_mel_bins
        if features is None or getattr(features, "ndim", 0) != 2 or features.shape[0] != bins:
            raise InvalidRequest(f"audio item needs features [{bins}, frames]")
        if features.shape[1] < 3:
            raise InvalidRequest("audio features are too short (under 3 frames)")
        return max(chunk_lengths(int(features.shape[1]), self.model.cfg.n_window))

    def encode(self, items: list[dict]) -> list[dict]:
        device = self.model.positions.device
        feats = [torch.as_tensor(np.asarray(it["features"], dtype=np.float32), device=device) for it in items]
        outs = self.model(feats)
        return [{"audio_embeds": o, "audio_keys": input_digest(it["features"], 0, len(o))} for it, o in zip(items, outs)]
