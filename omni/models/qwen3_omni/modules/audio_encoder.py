"""Qwen3-Omni's audio encoder (Whisper-like, weights under `thinker.audio_tower.`) in omni's code.

Log-mels are cut into chunks of 2*n_window frames; each chunk goes through three stride-2
convs (with its own sinusoidal positions), valid positions are packed, and the transformer
attends within windows of n_window_infer frames. Chunks are zero-padded to a common length
before the convs and that length leaks into the last valid positions (as in transformers),
so it is explicit here: `pad_len` (default: the longest chunk given, transformers' choice).
Inputs with equal `pad_len` batch together without changing any output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from omni.kernel.errors import InvalidRequest
from omni.layers.transformer import AudioEncoderLayer, input_digest, sinusoids
from omni.models.qwen3_omni.config import AudioEncoderConfig, load_config
from omni.models.weights import load_module

PREFIX = "thinker.audio_tower"


def conv_out_len(n: int) -> int:
    """Length after three (kernel 3, stride 2, padding 1) convs."""
    for _ in range(3):
        n = (n - 1) // 2 + 1
    return n


def chunk_lengths(frames: int, n_window: int) -> list[int]:
    chunk = 2 * n_window
    return [chunk] * (frames // chunk) + ([frames % chunk] if frames % chunk else [])


def window_spans(frames: int, pad_len: int, n_window: int, n_window_infer: int) -> list[tuple[int, int]]:
    """The clip's attention windows as (start, stop) frames. Attention never crosses one, chunks
    never straddle one and each chunk has its own positions, so a clip encoded window by window
    (each with the clip's `pad_len`) gives the rows of the whole clip (to the batching tolerance):
    a window can be encoded as soon as its frames are known, while the rest is still spoken."""
    chunk = 2 * n_window
    size = max(1, n_window_infer // chunk) * chunk
    if pad_len < chunk:  # a clip under one chunk: one window
        return [(0, frames)]
    return [(a, min(a + size, frames)) for a in range(0, frames, size)]


def default_pad_len(lengths: list[int], n_window: int) -> int:
    """transformers pads every chunk of a call to the longest chunk of that call."""
    return max(max(chunk_lengths(n, n_window)) for n in lengths)


class AudioEncoder(nn.Module):
    def __init__(self, cfg: AudioEncoderConfig):
        super().__init__()
        if cfg.activation != "gelu":
            raise ValueError(f"unsupported audio activation {cfg.activation!r}")
        self.cfg = cfg
        c = cfg.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, c, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(c, c, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(c, c, 3, 2, padding=1)
        freq = (((cfg.num_mel_bins + 1) // 2 + 1) // 2 + 1) // 2
        self.conv_out = nn.Linear(c * freq, cfg.d_model, bias=False)
        self.layers = nn.ModuleList([AudioEncoderLayer(cfg.d_model, cfg.num_heads, cfg.ffn_dim)
                                     for _ in range(cfg.num_layers)])
        self.ln_post = nn.LayerNorm(cfg.d_model)
        self.proj1 = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj2 = nn.Linear(cfg.d_model, cfg.output_dim)
        self.register_buffer("positions", sinusoids(cfg.max_source_positions, cfg.d_model), persistent=False)

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path, dtype=None, device: str = "cpu") -> "AudioEncoder":
        return load_module(lambda: cls(load_config(ckpt_dir).thinker.audio), ckpt_dir, PREFIX, dtype, device)

    @torch.inference_mode()
    def forward(self, features: list[torch.Tensor], pad_len: int | None = None) -> list[torch.Tensor]:
        """features: [num_mel_bins, frames_i] per audio -> [tokens_i, output_dim] per audio."""
        nw = self.cfg.n_window
        lengths = [int(f.shape[-1]) for f in features]
        if not features or min(lengths) < 1:
            raise ValueError("every audio needs at least one feature frame")
        pad_len = pad_len or default_pad_len(lengths, nw)
        chunks, valid = [], []
        for f, n in zip(features, lengths):
            start = 0
            for size in chunk_lengths(n, nw):
                chunks.append(F.pad(f[:, start:start + size], (0, pad_len - size)))
                valid.append(conv_out_len(size))
                start += size
        dtype = self.conv2d1.weight.dtype
        x = torch.stack(chunks)[:, None].to(dtype)
        x = F.gelu(self.conv2d3(F.gelu(self.conv2d2(F.gelu(self.conv2d1(x))))))
        b, c, fr, t = x.shape
        x = self.conv_out(x.permute(0, 3, 1, 2).reshape(b, t, c * fr)) + self.positions[:t].to(x.dtype)
        tokens = torch.cat([x[i, :v] for i, v in enumerate(valid)])
        windows = self._windows(lengths, pad_len)
        hidden, mask = self._pack(tokens, windows)
        for layer in self.layers:
            hidden = layer(hidden, mask)
        out = hidden[mask]
        out = self.proj2(F.gelu(self.proj1(self.ln_post(out))))
        per_audio = [sum(valid_of) for valid_of in self._split(valid, lengths)]
        return list(out.split(per_audio))

    def _split(self, valid: list[int], lengths: list[int]) -> list[list[int]]:
        out, i = [], 0
        for n in lengths:
            k = len(chunk_lengths(n, self.cfg.n_window))
            out.append(valid[i:i + k])
            i += k
        return out

    def _windows(self, lengths: list[int], pad_len: int) -> list[int]:
        """Attention window sizes, in order: each audio's tokens cut into n_window_infer spans."""
        span = conv_out_len(pad_len) * (self.cfg.n_window_infer // (2 * self.cfg.n_window))
        sizes = []
        for n in lengths:
            total = sum(conv_out_len(s) for s in chunk_lengths(n, self.cfg.n_window))
            sizes += [span] * (total // span) + ([total % span] if total % span else [])
        return sizes

    @staticmethod
    def _pack(tokens: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        longest = max(sizes)
        pieces = [F.pad(p, (0, 0, 0, longest - len(p))) for p in tokens.split(sizes)]
        mask = torch.arange(longest)[None, :] < torch.tensor(sizes)[:, None]
        return torch.stack(pieces), mask.to(tokens.device)


class AudioFeaturesEncoder:
    """`BatchEncoder` for the encoder stage. Item: {"features": [mel_bins, frames] float32,
    "pad_len": optional int (the request's longest chunk, to match transformers when a
    request has several audios)}. Output: {"audio_embeds": [tokens, output_dim]}, the key the
    thinker takes, and {"audio_keys": [tokens, 16] uint8}: each row the digest of what decided it
    (features and pad_len). The thinker's prefix cache keys audio rows by it: the embeddings of one
    audio differ in their last bits by what it was batched with, its inputs do not."""

    def __init__(self, model: AudioEncoder):
        self.model = model

    def batch_key(self, item: dict) -> int:
        features = item.get("features")
        if features is None or getattr(features, "ndim", 0) != 2 or features.shape[0] != self.model.cfg.num_mel_bins:
            raise InvalidRequest(f"audio item needs features [{self.model.cfg.num_mel_bins}, frames]")
        if features.shape[1] < 1:
            raise InvalidRequest("audio features are empty")
        return int(item.get("pad_len") or default_pad_len([features.shape[1]], self.model.cfg.n_window))

    def encode(self, items: list[dict]) -> list[dict]:
        device = self.model.positions.device
        feats = [torch.as_tensor(np.asarray(it["features"], dtype=np.float32), device=device) for it in items]
        pad_len = self.batch_key(items[0])
        outs = self.model(feats, pad_len=pad_len)
        return [{"audio_embeds": o, "audio_keys": input_digest(it["features"], pad_len, len(o))}
                for it, o in zip(items, outs)]
