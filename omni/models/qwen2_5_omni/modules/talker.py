"""The Qwen2.5-Omni talker (one codebook) on omni's AR engine, fed by the thinker's hidden-state stream.

transformers' `Qwen2_5OmniTalkerForConditionalGeneration` as its `generate` drives it. With the thinker's
taps 0 (embeddings e) and last (final normed hidden h), for a prompt of P tokens and generated text
tokens g_0, g_1, ...:

    position p < P   : h(p) + e(p)          (e zeroed at audio / image / video placeholders)
    position P       : embed(speaker's bos token)
    position P + 1   : h(g_0) + e(g_0)
    position P + 1 + k (k >= 1): codec(code k-1) + R[k], where R[k] = h(g_k) + e(g_k) while the thinker
                       gave a row for g_k (every generated token but its last), then embed(text eos)
                       once, then embed(text pad) for ever

each row through `thinker_to_talker_proj`, then a dense Qwen2.5 decoder at positions 0, 1, 2, ... on all
three M-RoPE axes. That is the path transformers' `generate` (5.24) runs: it hands the talker no attention
mask, and without one the talker's forward neither adds the codec pad / bos embeddings to rows P and P + 1
nor computes the 3-D (image / video) positions it would with a mask. embed() is
the thinker's token embedding: the rows the talker needs of it (text eos, pad, every speaker's bos)
are read from the checkpoint at load. Codes stop at codec pad or end (the reference's eos pair);
codec bos is never sampled. A sequence parks (`input_ready`) until the row its next step needs arrived.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omni.kernel.errors import InvalidRequest
from omni.layers.decoder_layer import DecoderLayer
from omni.layers.norms import RMSNorm
from omni.layers.rotary import mrope_cos_sin, rope_inv_freq
from omni.models.qwen2_5_omni.config import Qwen2_5OmniConfig, load_omni_config
from omni.models.weights import CheckpointError, load_state_dict, thinker_token_rows
from omni.stages.ar.model_api import ARModel, DecodeForm, ForwardBatch, ForwardOutput, KVCacheSpec
from omni.stages.ar.sampler import SuppressTokens

STATE_KEY = "talker_rows"
CODES_KEY = "code_rows"  # per sequence: its output codes' embeddings, on the device (after_sample)


@dataclass
class ThinkerRows:
    """One request's thinker rows as they stream in (tap 0 and the last tap of every position)."""

    prompt_ids: list[int] | None = None
    prompt: torch.Tensor | None = None  # [P, H] h + e (placeholders' e zeroed)
    reply: list[torch.Tensor] = field(default_factory=list)  # h(g_k) + e(g_k), k = 0, 1, ...
    closed: bool = False  # the thinker is done: after the last reply row come text eos, then pad
    grids: dict[str, Any] = field(default_factory=dict)  # image_grid_thw / video_grid_thw (kept, unused: see above)

    def ready(self) -> bool:
        return self.prompt is not None and bool(self.reply)


class TalkerModel(nn.Module):
    def __init__(self, cfg: Qwen2_5OmniConfig) -> None:
        super().__init__()
        t = cfg.talker.text
        self.embed_tokens = nn.Embedding(t.vocab_size, cfg.talker.embedding_size)
        self.layers = nn.ModuleList(DecoderLayer(t, i, qwen2=True) for i in range(t.num_layers))
        self.norm = RMSNorm(t.hidden_size, t.rms_norm_eps)


class Qwen2_5OmniTalker(nn.Module, ARModel):
    supports_cuda_graphs = True  # forward reads no spans; rows come as embeddings
    decode_form = DecodeForm(embeds=True, pos_lead=(3,), pos_dtype=torch.float32)
    lookahead_decode = True  # a step's input is its last code's embedding, kept on the device (`after_sample`)

    def __init__(self, cfg: Qwen2_5OmniConfig, text_rows: dict[int, torch.Tensor], speakers: dict[str, int],
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if cfg.talker is None:
            raise CheckpointError("the checkpoint has no talker (no audio output)")
        self.cfg, tk = cfg, cfg.talker
        self.text_cfg = tk.text
        self.thinker_to_talker_proj = nn.Linear(tk.embedding_size, tk.text.hidden_size)
        self.model = TalkerModel(cfg)
        self.codec_head = nn.Linear(tk.text.hidden_size, tk.text.vocab_size, bias=False)
        self.register_buffer("text_rows", torch.zeros(len(text_rows), tk.embedding_size), persistent=False)
        self.row_of = {tok: i for i, tok in enumerate(text_rows)}  # thinker id -> row of `text_rows`
        self._rows = text_rows
        self.speakers = {k.lower(): int(v) for k, v in speakers.items()}
        self.section = tuple(tk.text.mrope_section) or (16, 24, 24)
        self.inv_freq = rope_inv_freq(tk.text.head_dim, tk.text.rope_theta)
        th = cfg.thinker
        self.media_ids = (th.audio_token_id, th.image_token_id, th.video_token_id)  # not a tensor: built on meta
        self.stop_ids = (tk.codec_pad_id, tk.codec_eos_id)
        self.to(dtype)

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path, device: str = "cpu", dtype: torch.dtype | None = None):
        from omni.models.qwen2_5_omni.modules.token2wav import load_speakers

        cfg = load_omni_config(ckpt_dir)
        dtype = dtype or torch.float32
        speakers = {name: int(v["bos_token"]) for name, v in load_speakers(ckpt_dir).items()}
        tk = cfg.talker
        if tk is None:
            raise CheckpointError(f"{ckpt_dir} has no talker (no audio output)")
        ids = sorted({tk.text_eos_id, tk.text_pad_id, *speakers.values()})
        rows = dict(zip(ids, thinker_token_rows(ckpt_dir, tuple(ids))))
        state = load_state_dict(ckpt_dir, "talker", device=str(device), dtype=dtype)
        with torch.device("meta"):
            model = cls(cfg, {i: rows[i] for i in ids}, speakers, dtype)
        model.load_state_dict(state, strict=True, assign=True)
        model.text_rows = torch.stack([rows[i] for i in ids]).to(device, dtype)
        model.inv_freq = rope_inv_freq(tk.text.head_dim, tk.text.rope_theta)
        return model.eval()

    # ---- ARModel ---------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.codec_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.codec_head.weight.device

    def kv_cache_spec(self) -> KVCacheSpec:
        t = self.text_cfg
        return KVCacheSpec(t.num_layers, t.num_kv_heads, t.head_dim, self.dtype, t.vocab_size)

    def logits_processors(self) -> list:
        return [SuppressTokens(self.never_sampled(), self.text_cfg.vocab_size, self.device)]

    def never_sampled(self) -> list[int]:
        """Codec bos (as the reference), and every id token2wav cannot embed but the stop ids: the
        published vocabulary (8,448) runs past the DiT's codebook (num_embeds + 1 = 8,194), and a code
        there would fail the stream at token2wav (a trained talker does not emit them; random weights do)."""
        codebook = self.cfg.token2wav.dit.num_embeds + 1 if self.cfg.token2wav is not None else self.text_cfg.vocab_size
        above = [i for i in range(codebook, self.text_cfg.vocab_size) if i not in self.stop_ids]
        return [self.cfg.talker.codec_bos_id, *above]

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.codec_head(hidden).float()

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        x = batch.inputs_embeds if batch.inputs_embeds is not None else self.embed_tokens(batch.input_ids)
        x = self.thinker_to_talker_proj(x)
        cos, sin = mrope_cos_sin(self.inv_freq, batch.positions, self.section, x.dtype, interleaved=False)
        for layer in self.model.layers:
            x = layer(x, cos, sin, batch)
        return ForwardOutput(self.model.norm(x))

    # ---- per-request inputs ----------------------------------------------------------
    def prompt_ids(self, num_prompt: int) -> list[int]:
        """The placeholder ids of a talker prompt (the reference's: they count in its repetition penalty)."""
        tk = self.cfg.talker
        return [tk.codec_mask_id] * num_prompt + [tk.codec_pad_id, tk.codec_bos_id]

    def text_row(self, token: int) -> torch.Tensor:
        return self.text_rows[self.row_of[token]]

    def prepare(self, seq, inputs: dict[str, Any]) -> None:
        rows: ThinkerRows = inputs.get(STATE_KEY)
        speaker = inputs.get("speaker")
        if not isinstance(rows, ThinkerRows) or not rows.ready() or set(inputs) - {STATE_KEY, "speaker"}:
            raise InvalidRequest("talker: needs the thinker's rows and a speaker")
        if speaker not in self.speakers:
            raise InvalidRequest(f"unknown voice {speaker!r}; this model's voices are: {', '.join(self.speakers)}")
        st = seq.model_state
        st[STATE_KEY], st["bos"] = rows, self.speakers[speaker]

    def positions(self, seq, start: int, end: int) -> torch.Tensor:
        return torch.arange(start, end, dtype=torch.float32).expand(3, -1)

    def decode_inputs(self, seqs: list, starts: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Every row past its prompt: its last code's embedding plus its thinker row, in two launches for
        the batch (row by row otherwise)."""
        rows = []
        for seq, p in zip(seqs, starts):
            k = p - seq.num_prompt_tokens
            kept = seq.model_state.get(CODES_KEY, ())
            reply = self._reply(seq.model_state[STATE_KEY], k + 1) if 0 <= k < len(kept) else None
            if reply is None:
                return None
            rows.append((kept[k], reply))
        codes, replies = zip(*rows)
        positions = torch.tensor(starts, dtype=torch.float32).expand(3, -1)
        return positions, (torch.stack(codes) + torch.stack(replies)).to(self.dtype)

    def after_sample(self, seqs: list, tokens: torch.Tensor, hidden: torch.Tensor) -> None:
        """Each row's new code embedded on the device: the next step's input (lookahead: before the code
        reaches the host). Row j of a sequence's list is its output token j."""
        embedded = self.model.embed_tokens(tokens.clamp_min(0))  # -1: a non-finite row, failed by the engine
        for i, seq in enumerate(seqs):
            seq.model_state.setdefault(CODES_KEY, []).append(embedded[i])

    def _reply(self, rows: ThinkerRows, k: int) -> torch.Tensor | None:
        if k < len(rows.reply):
            return rows.reply[k]
        if not rows.closed:
            return None
        tk = self.cfg.talker
        return self.text_row(tk.text_eos_id if k == len(rows.reply) else tk.text_pad_id)

    def input_ready(self, seq) -> bool:
        rows, p = seq.model_state[STATE_KEY], seq.num_tokens - 1  # the position the next step feeds
        return p < seq.num_prompt_tokens or self._reply(rows, p - seq.num_prompt_tokens + 1) is not None

    def input_embeds(self, seq, start: int, end: int) -> torch.Tensor:
        st = seq.model_state
        rows: ThinkerRows = st[STATE_KEY]
        n_prompt = seq.num_prompt_tokens  # P + 2
        ids = seq.token_ids(start, end)
        out = []
        for p in range(start, end):
            if p < n_prompt - 2:
                out.append(rows.prompt[p])
            elif p == n_prompt - 2:
                out.append(self.text_row(st["bos"]))
            elif p == n_prompt - 1:
                out.append(rows.reply[0])
            else:
                reply = self._reply(rows, p - n_prompt + 1)
                if reply is None:
                    raise RuntimeError("talker: a step ran before its thinker row arrived")
                out.append(self._code_row(seq, p - n_prompt, ids[p - start]) + reply)
        return torch.stack(out).to(self.dtype)

    def _code_row(self, seq, j: int, host_id: int) -> torch.Tensor:
        """Output token j's embedding: kept on the device since it was sampled, else (no sampling step
        saw it) from its host id."""
        kept = seq.model_state.get(CODES_KEY, ())
        return kept[j] if j < len(kept) else self.model.embed_tokens(torch.tensor(host_id, device=self.device))

    def prefix_key(self, seq, start: int, end: int) -> None:
        return None  # rows come from the thinker's hidden states: never cached

    def release(self, seq) -> None:
        seq.model_state.clear()


def prompt_rows(model: Qwen2_5OmniTalker, ids: list[int], embed: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """h + e of the thinker's prompt rows, e zeroed at the media placeholders (as the reference does)."""
    media = torch.isin(torch.tensor(ids), torch.tensor(model.media_ids)).to(embed.device)
    return hidden + embed.masked_fill(media[:, None], 0.0)
