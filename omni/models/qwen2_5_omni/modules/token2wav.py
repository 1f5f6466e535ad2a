"""Qwen2.5-Omni's token2wav: the DiT (codes -> mel by flow matching) and BigVGAN (mel -> PCM) as one
`DiffusionModel` of omni's diffusion stage, with the speakers of `spk_dict.pt`.

A stream holds its speaker's conditioning (the `cond` vector, the ECAPA encodings of its reference
mel and of the null row's zero mel, computed once) and a `MelStream` that vocodes the mel chunks
as they come. Weights load by name under `token2wav.` (`code2wav_dit_model.`,
`code2wav_bigvgan_model.`), as the reference lays them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from omni.kernel.errors import InvalidRequest
from omni.models.qwen2_5_omni.config import SPEAKERS_FILE, Token2WavConfig, load_config
from omni.models.qwen2_5_omni.modules.bigvgan import BigVGAN
from omni.models.qwen2_5_omni.modules.dit import DiT
from omni.models.weights import CheckpointError, load_module

PREFIX = "token2wav"
VOCODER_PAD = 8  # mel frames: chunk windows are padded to multiples of this, to share vocoder calls and graphs


def load_speakers(ckpt_dir: str | Path) -> dict[str, dict[str, Any]]:
    """`spk_dict.pt`: {speaker: {"cond": [1, enc_emb_dim], "ref_mel": [1, T, mel_dim], "bos_token"}}
    (loaded with weights_only: tensors and plain values, no code)."""
    path = Path(ckpt_dir) / SPEAKERS_FILE
    if not path.is_file():
        raise CheckpointError(f"{ckpt_dir} has no {SPEAKERS_FILE} (the speakers' conditioning)")
    speakers = torch.load(path, map_location="cpu", weights_only=True)
    for name, entry in speakers.items():
        if not {"cond", "ref_mel"} <= set(entry):
            raise CheckpointError(f"{path}: speaker {name!r} lacks cond / ref_mel")
    return speakers


class MelStream:
    """Vocodes a stream's mel as it grows: a frame's PCM goes out once `context` frames of mel
    follow it (or the stream ended), decoded with `context` frames on each side, which is what the
    whole utterance's decode gives (the vocoder sees no farther)."""

    def __init__(self, vocoder: BigVGAN, context: int) -> None:
        self.vocoder, self.context = vocoder, context
        self.mel: torch.Tensor | None = None  # [mel_dim, frames kept]
        self.offset = 0  # the stream frame of self.mel[:, 0]
        self.out = 0  # frames whose PCM went out

    def take(self, mel: torch.Tensor | None, last: bool) -> tuple[torch.Tensor, int, int, bool] | None:
        """mel [frames, mel_dim] (or None) in -> what to vocode now: (the mel window [mel_dim, W], the
        samples [a, b) of its PCM that are final, whether the window may be padded at its end: its
        kept samples see no farther than its end); None: nothing yet."""
        if mel is not None and len(mel):
            mel = mel.T
            self.mel = mel if self.mel is None else torch.cat([self.mel, mel], dim=1)
        if self.mel is None:
            return None
        total = self.offset + self.mel.shape[1]
        upto = total if last else total - self.context
        if upto <= self.out:
            return None
        lo = max(self.offset, self.out - self.context)
        hi = min(total, upto + self.context)
        window = self.mel[:, lo - self.offset:hi - self.offset]
        hop = self.vocoder.hop
        cut = ((self.out - lo) * hop, (upto - lo) * hop, upto + self.context <= hi)
        self.out = upto
        keep = max(self.offset, self.out - self.context)
        self.mel, self.offset = self.mel[:, keep - self.offset:], keep
        return (window, *cut)

    def push(self, mel: torch.Tensor | None, last: bool) -> torch.Tensor | None:
        """`take`, vocoded alone: the PCM now final, [samples] (None: none yet)."""
        got = self.take(mel, last)
        if got is None:
            return None
        window, a, b, _ = got
        return self.vocoder(window[None])[0][a:b]


def vocode_windows(vocoder, windows: list[tuple[torch.Tensor, int, int, bool]], pad: int) -> list[torch.Tensor]:
    """Many streams' `MelStream.take` windows in few vocoder calls: those that may be padded are
    padded at their end (their last frame repeated) to a multiple of `pad` frames and run together
    per length; the rest alone. -> each window's final PCM [b - a], in order."""
    out: list[torch.Tensor | None] = [None] * len(windows)
    groups: dict[int, list[int]] = {}
    for i, (mel, a, b, paddable) in enumerate(windows):
        width = -(-mel.shape[1] // pad) * pad if paddable else -1 - i  # a unique key: alone
        groups.setdefault(width, []).append(i)
    for width, members in groups.items():
        mels = [windows[i][0] for i in members]
        if width > 0:
            mels = [torch.cat([m, m[:, -1:].expand(-1, width - m.shape[1])], dim=1) for m in mels]
        pcm = vocoder(torch.stack(mels))
        for row, i in enumerate(members):
            out[i] = pcm[row, windows[i][1]:windows[i][2]]
    return out


@dataclass
class Token2WavStream:
    cond: torch.Tensor  # [1, enc_emb_dim]
    spk: torch.Tensor  # [1, enc_dim]: ECAPA of the reference mel
    null_spk: torch.Tensor  # [1, enc_dim]: ECAPA of a zero mel of its length
    mel: MelStream


class Token2Wav(nn.Module):
    """The DiT and BigVGAN under their checkpoint names; the diffusion stage's model."""

    def __init__(self, cfg: Token2WavConfig, speakers: dict[str, dict[str, Any]] | None = None):
        super().__init__()
        self.cfg = cfg
        self.code2wav_dit_model = DiT(cfg.dit)
        self.code2wav_bigvgan_model = BigVGAN(cfg.bigvgan)
        self.speakers = {k.lower(): v for k, v in (speakers or {}).items()}
        self.speaker_names = list((speakers or {}).keys())
        self.sample_rate = cfg.sample_rate
        self.latent_dim = cfg.dit.mel_dim
        self.frames_per_token = cfg.dit.repeats
        self.align_tokens = cfg.dit.block_tokens
        self.max_frames = cfg.dit.max_position_embeddings
        self.codebook_size = cfg.dit.num_embeds + 1
        self.pad_frames = cfg.dit.block_size  # windows may be padded at their end (`velocity`'s lengths)
        self.feature_dim = cfg.dit.enc_dim + cfg.dit.emb_dim + cfg.dit.enc_emb_dim  # `features`' width
        self.vocoder_context = self.code2wav_bigvgan_model.context_frames()
        self.vocoder_graphs = None  # `prepare`: the vocoder's chunk windows replayed from CUDA graphs

    @property
    def device(self) -> torch.device:
        return self.code2wav_dit_model.proj_out.weight.device

    @property
    def feature_dtype(self) -> torch.dtype:
        return self.code2wav_dit_model.proj_out.weight.dtype

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path, dtype=None, device: str = "cpu") -> "Token2Wav":
        cfg = load_config(ckpt_dir)
        speakers = load_speakers(ckpt_dir)
        return load_module(lambda: cls(cfg, speakers), ckpt_dir, PREFIX, dtype, device)

    # ---- the diffusion stage's model --------------------------------------------------
    def new_stream(self, params: dict[str, Any]) -> Token2WavStream:
        name = params.get("speaker") or params.get("voice") or (self.speaker_names[0] if self.speaker_names else None)
        entry = self.speakers.get(str(name).lower()) if name is not None else None
        if entry is None:
            raise InvalidRequest(f"unknown speaker {name!r}; known: {self.speaker_names}")
        p = self.code2wav_dit_model.proj_out.weight
        cond = entry["cond"].to(p.device, p.dtype).reshape(1, -1)
        ref_mel = entry["ref_mel"].to(p.device, p.dtype).reshape(1, -1, self.latent_dim)
        dit = self.code2wav_dit_model
        with torch.inference_mode():
            spk, null_spk = dit.encode_speaker(torch.cat([ref_mel, torch.zeros_like(ref_mel)])).chunk(2)
        return Token2WavStream(cond, spk, null_spk, MelStream(self.code2wav_bigvgan_model, self.vocoder_context))

    def features(self, stream: Token2WavStream, tokens: torch.Tensor, guided: bool):
        dit, codes = self.code2wav_dit_model, tokens[None]
        with torch.inference_mode():
            feats = dit.features(codes, stream.spk, stream.cond)[0]
            null = dit.features(torch.zeros_like(codes), stream.null_spk, torch.zeros_like(stream.cond))[0] if guided else None
        return feats, null

    def velocity(self, x: torch.Tensor, t: torch.Tensor, feats: torch.Tensor,
                 lengths: torch.Tensor | None = None) -> torch.Tensor:
        """In the DiT's dtype; the ODE's state and the velocity returned stay in x's (float32)."""
        return self.code2wav_dit_model.velocity(x.to(self.feature_dtype), t, feats, lengths).to(x.dtype)

    def render(self, streams: list[Token2WavStream], mels: list[torch.Tensor | None],
               lasts: list[bool]) -> list[dict[str, Any] | None]:
        """Each stream's mel chunk [frames, mel_dim] (or None) -> the PCM it makes final, vocoded
        together (one copy to the host for all)."""
        with torch.inference_mode():
            taken = [s.mel.take(m, last) for s, m, last in zip(streams, mels, lasts)]
            windows = [t for t in taken if t is not None]
            vocoder = self.vocoder_graphs or self.code2wav_bigvgan_model
            pcms = vocode_windows(vocoder, windows, VOCODER_PAD) if windows else []
            host = torch.cat([p.float() for p in pcms]).cpu().numpy() if pcms else None
        out, at, k = [], 0, 0
        for t in taken:
            if t is None:
                out.append(None)
                continue
            n = pcms[k].shape[0]
            out.append({"pcm": np.ascontiguousarray(host[at:at + n]), "sample_rate": self.sample_rate})
            at, k = at + n, k + 1
        return out

    def prepare(self, chunk_frames: list[int], max_streams: int) -> int:
        """CUDA graphs of the vocoder for the windows a stream whose chunks have these lengths (in
        frames) meets, for up to `max_streams` at once (nothing off CUDA). Returns how many."""
        from omni.layers.graph_capture import ShapeGraphs
        from omni.stages.ar.cuda_graphs import batch_buckets

        if self.device.type != "cuda":
            return 0
        voc, mel_dim = self.code2wav_bigvgan_model, self.code2wav_bigvgan_model.cfg.mel_dim
        probe, widths = MelStream(voc, self.vocoder_context), set()
        for frames in chunk_frames:
            got = probe.take(torch.zeros(frames, mel_dim), last=False)
            if got is not None and got[3]:
                widths.add(-(-got[0].shape[1] // VOCODER_PAD) * VOCODER_PAD)
        graphs = ShapeGraphs(voc, self.device)
        shapes = [(n, mel_dim, w) for n in batch_buckets(max_streams) for w in widths]
        with torch.inference_mode():
            if not graphs.capture(shapes, torch.float32):
                return 0
            g = torch.Generator(device=self.device).manual_seed(0)
            probes = [torch.randn(shape, generator=g, device=self.device) - 5 for shape in
                      (max(shapes), min(shapes), shapes[len(shapes) // 2])]
            if not graphs.agrees(probes):  # what a replay gives must be what the eager vocoder gives
                return 0
        self.vocoder_graphs = graphs
        return len(graphs.graphs)
