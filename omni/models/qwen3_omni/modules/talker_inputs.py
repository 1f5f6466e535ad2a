"""The talker's inputs, built from the thinker's hidden states as they stream in.

transformers builds them after the thinker has finished (`Qwen3OmniMoeForConditionalGeneration
.generate`); this module builds the same tensors incrementally, per request:

- prefill = user part + assistant part.
  The user part holds every prompt position whose role token (the token after the closest
  `<|im_start|>` at or before it) is `user`: `hidden_projection(hidden)` at audio / image /
  video placeholder tokens, `text_projection(embed)` elsewhere.
  The assistant part starts at the last `<|im_start|> assistant` of the prompt; with
  P = text_projection(embed[a:]) it is 9 rows:
      text  = P[0], P[1], P[2], tts_pad x4, tts_bos, P[3]
      codec = 0, 0, 0, nothink, think_bos, think_eos, speaker, codec_pad, codec_bos (embedded)
  so the prefill can start once the thinker row a+3 (its first generated token) arrived.
- trailing text: P[4:], then tts_eos, then tts_pad forever; decode step k adds entry k.
  A thinker row exists only for tokens the thinker computed, so its last sampled token
  (its EOS) never appears, exactly as in transformers. Entry k is known once row a+4+k
  arrived, or once the thinker has finished.
- rope positions: the talker's own token ids (user ids, then tts_pad for the assistant part)
  get plain positions, or, when they hold image / video placeholders, the 3-D M-RoPE index
  of those ids with the prompt's vision grids (which must arrive before the prefill).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from omni.kernel.errors import InvalidRequest
from omni.models.qwen3_omni.config import Qwen3OmniConfig
from omni.models.qwen3_omni.modules.rope import RopeTokens, VisionGrid, rope_index
from omni.models.weights import CheckpointError

Projection = Callable[[torch.Tensor], torch.Tensor]

ASSISTANT_PREFIX_ROWS = 4  # <|im_start|>, assistant, "\n", first generated token


@dataclass(frozen=True)
class TalkerTokenIds:
    """Special token ids the talker's input construction uses (thinker and codec vocabularies)."""

    im_start: int
    user: int
    assistant: int
    tts_bos: int
    tts_eos: int
    tts_pad: int
    multimodal: tuple[int, ...]  # audio, image, video placeholders
    codec_nothink: int
    codec_think_bos: int
    codec_think_eos: int
    codec_pad: int
    codec_bos: int
    codec_eos: int
    speakers: dict[str, int]
    rope: RopeTokens  # the talker's own vision ids and M-RoPE constants

    @classmethod
    def from_config(cls, cfg: Qwen3OmniConfig) -> "TalkerTokenIds":
        t, th = cfg.talker, cfg.thinker
        if t is None:
            raise CheckpointError("this checkpoint has no talker (enable_audio_output is off)")
        if not t.speaker_id:
            raise CheckpointError("talker_config.speaker_id is empty: no voice to speak with")
        raw = t.raw
        return cls(
            im_start=cfg.im_start_token_id,
            user=cfg.user_token_id,
            assistant=cfg.assistant_token_id,
            tts_bos=cfg.tts_bos_token_id,
            tts_eos=cfg.tts_eos_token_id,
            tts_pad=cfg.tts_pad_token_id,
            multimodal=(th.audio_token_id, th.image_token_id, th.video_token_id),
            codec_nothink=t.codec_nothink_id,
            codec_think_bos=t.codec_think_bos_id,
            codec_think_eos=t.codec_think_eos_id,
            codec_pad=t.codec_pad_id,
            codec_bos=t.codec_bos_id,
            codec_eos=t.codec_eos_token_id,
            speakers=dict(t.speaker_id),
            rope=RopeTokens(
                int(raw.get("image_token_id", 151655)), int(raw.get("video_token_id", 151656)),
                float(raw.get("position_id_per_seconds", 25)), int(raw.get("spatial_merge_size", 2)),
                audio_token_id=int(th.audio_token_id),
            ),
        )

    def speaker_id(self, name: str) -> int:
        try:
            return self.speakers[name.lower()]
        except KeyError:
            raise InvalidRequest(f"unknown speaker {name!r}; known: {sorted(self.speakers)}") from None


class DeferredRows:
    """Trailing text rows of every request, projected together: at 64 streams a thinker step brings one
    row per stream, and projecting each on its own (a small MLP: a few launches and Python a row) was
    ~28 % of the talker's time on an H200 (RESULTS 2026-12-04). Rows wait here until a step reads one
    (`TalkerInputs.trailing`) or the stage flushes them before its step: within the round that took
    them, so a channel's view is read before its slot goes back. On CUDA only: one GEMM over many
    rows rounds differently from one a row, and the CPU parity tests compare bit for bit."""

    def __init__(self, projection: Projection) -> None:
        self.projection = projection
        self.pending: list[tuple["TalkerInputs", torch.Tensor]] = []

    def add(self, inputs: "TalkerInputs", raw: torch.Tensor) -> None:
        self.pending.append((inputs, raw))
        inputs.deferred_rows += int(raw.shape[0])

    def flush(self) -> None:
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        rows = self.projection(torch.cat([raw for _, raw in pending]))
        at = 0
        for inputs, raw in pending:
            n = int(raw.shape[0])
            inputs._trailing.extend(rows[at : at + n])
            inputs.deferred_rows -= n
            at += n


@dataclass
class TalkerParts:
    """What input construction needs from the talker model: its projections and embeddings."""

    text_projection: Projection  # [N, thinker H] -> [N, talker H]
    hidden_projection: Projection
    codec_embed: Projection  # [N] codec ids -> [N, talker H]
    tts_embeds: torch.Tensor  # [3, talker H]: projected tts_bos, tts_eos, tts_pad
    deferred: DeferredRows | None = None  # trailing rows projected for all requests at once (CUDA)


class TalkerInputs:
    """One request's thinker stream, turned into talker prefill rows and trailing text rows."""

    def __init__(self, ids: TalkerTokenIds, parts: TalkerParts, speaker: str, prompt_ids: list[int] | None = None) -> None:
        self.ids, self.parts = ids, parts
        self.speaker_id = ids.speaker_id(speaker)
        self.prompt_ids: list[int] | None = None
        self.num_rows = 0  # thinker rows received (prompt + computed generated tokens)
        self.thinker_done = False
        self._embeds: list[torch.Tensor] = []  # prompt rows, kept until the prefill is built
        self._hiddens: list[torch.Tensor] = []
        self._assistant_start = -1
        self._prefill: torch.Tensor | None = None
        self._assistant_rows: list[torch.Tensor] = []  # projected rows a .. a+3
        self._trailing: list[torch.Tensor] = []  # projected rows a+4 ..
        self.deferred_rows = 0  # rows a+4+len(_trailing) .. waiting in `parts.deferred`
        self._images: list[VisionGrid] = []
        self._videos: list[VisionGrid] = []
        self.waiting_for_grids = False
        self.positions: torch.Tensor | None = None  # [3, L] float32 rope positions of the prefill
        # prefix caching (TalkerModel.prefix_key): the thinker row each user-part row was projected
        # from, on the host ([user rows, thinker H]), and whether it went through hidden_projection
        self.user_source: torch.Tensor | None = None
        self.user_is_media: bytes = b""
        self.delta = 0.0  # decode position = index + delta
        if prompt_ids is not None:
            self.set_prompt(prompt_ids)

    # ---- the thinker stream ------------------------------------------------------------
    def set_prompt(self, prompt_ids: list[int]) -> None:
        """The thinker's prompt token ids (needed before its rows can be used)."""
        if self.prompt_ids is not None:
            raise InvalidRequest("talker: prompt token ids given twice")
        if not prompt_ids:
            raise InvalidRequest("talker: empty prompt")
        self.prompt_ids = [int(t) for t in prompt_ids]
        self._assistant_start = self._find_assistant_start(self.prompt_ids)

    def feed(self, embed: torch.Tensor, hidden: torch.Tensor) -> None:
        """Rows ([n, H] each: layer 0 and layer `accept_hidden_layer`) of the thinker's next
        computed tokens, in order: the prompt first (in any number of chunks), then one row
        per generated token the thinker fed back."""
        if self.prompt_ids is None:
            raise InvalidRequest("talker: thinker rows before the prompt token ids")
        n = int(embed.shape[0])
        if hidden.shape[0] != n:
            raise InvalidRequest(f"thinker chunk has {n} embed rows but {hidden.shape[0]} hidden rows")
        if self.thinker_done:
            raise InvalidRequest("thinker chunk after the thinker finished")
        if n == 0:
            return
        start = self.num_rows
        self.num_rows += n
        prompt_len = len(self.prompt_ids)
        if start < prompt_len:
            keep = min(n, prompt_len - start)
            self._embeds.append(embed[:keep].clone())
            self._hiddens.append(hidden[:keep].clone())
        self._take_assistant_rows(embed, start)
        self._maybe_build_prefill()

    def add_grids(self, images: list[VisionGrid], videos: list[VisionGrid]) -> None:
        """Vision grids of the prompt's images / videos, in prompt order (any number of calls)."""
        self._images += images
        self._videos += videos
        self._maybe_build_prefill()

    def finish(self) -> None:
        """The thinker's stream ended: the trailing text is now fully known."""
        self.thinker_done = True

    # ---- what the talker needs ---------------------------------------------------------
    @property
    def prefill(self) -> torch.Tensor | None:
        """[L, talker H] prefill rows once they can be built, else None."""
        return self._prefill

    @property
    def starved(self) -> bool:
        """True when the thinker finished before its first generated token had a row:
        transformers cannot build a talker input then, and no speech is produced."""
        return self._prefill is None and self.thinker_done and not self.waiting_for_grids

    def trailing(self, k: int) -> torch.Tensor | None:
        """Text row added at decode step k, or None while it is not known yet."""
        if k >= len(self._trailing) and self.deferred_rows:
            self.parts.deferred.flush()
        if k < len(self._trailing):
            return self._trailing[k]
        if not self.thinker_done:
            return None
        bos_eos_pad = self.parts.tts_embeds
        return bos_eos_pad[1] if k == len(self._trailing) else bos_eos_pad[2]

    # ---- internals ---------------------------------------------------------------------
    def _find_assistant_start(self, ids: list[int]) -> int:
        for i in range(len(ids) - 2, -1, -1):
            if ids[i] == self.ids.im_start and ids[i + 1] == self.ids.assistant:
                return i
        raise InvalidRequest("talker: the prompt has no '<|im_start|>assistant' turn to speak")

    def _take_assistant_rows(self, embed: torch.Tensor, start: int) -> None:
        """Project the rows of this chunk at or after the assistant start."""
        a = self._assistant_start
        first = max(a, start)
        if first >= start + embed.shape[0]:
            return
        rows = embed[first - start :]
        prefix = ASSISTANT_PREFIX_ROWS - len(self._assistant_rows)
        if self.parts.deferred is not None and prefix <= 0:
            self.parts.deferred.add(self, rows)
            return
        projected = self.parts.text_projection(rows)
        for row in projected:
            if len(self._assistant_rows) < ASSISTANT_PREFIX_ROWS:
                self._assistant_rows.append(row)
            else:
                self._trailing.append(row)

    def _maybe_build_prefill(self) -> None:
        if self._prefill is not None or len(self._assistant_rows) < ASSISTANT_PREFIX_ROWS:
            return
        if self.num_rows < len(self.prompt_ids):
            return
        user_pos = self._user_positions()
        talker_ids = [self.prompt_ids[i] for i in user_pos] + [self.ids.tts_pad] * (2 * ASSISTANT_PREFIX_ROWS + 1)
        if not self._build_positions(talker_ids):
            return
        self._prefill = torch.cat((self._user_part(user_pos), self._assistant_part()), dim=0)
        self._embeds, self._hiddens = [], []

    def _build_positions(self, talker_ids: list[int]) -> bool:
        """Rope positions of the talker's prefill; False while vision grids are missing."""
        r = self.ids.rope
        runs = {r.image_token_id: 0, r.video_token_id: 0}
        for i, tok in enumerate(talker_ids):  # a video interleaved with its audio is one run
            if tok in runs and (i == 0 or talker_ids[i - 1] not in (tok, r.audio_token_id)):
                runs[tok] += 1
        n_img, n_vid = runs[r.image_token_id], runs[r.video_token_id]
        if n_img == n_vid == 0:
            self.positions = torch.arange(len(talker_ids), dtype=torch.float32).expand(3, -1)
            return True
        if len(self._images) < n_img or len(self._videos) < n_vid:
            self.waiting_for_grids = True
            return False
        self.waiting_for_grids = False
        self.positions, self.delta = rope_index(talker_ids, r, self._images[:n_img], self._videos[:n_vid])
        return True

    def _user_positions(self) -> list[int]:
        """Prompt positions whose role token (after the closest <|im_start|>) is `user`."""
        ids, roles, last_start = self.prompt_ids, [], -1
        for pos, tok in enumerate(ids):
            if tok == self.ids.im_start:
                last_start = pos
            roles.append(ids[min(max(last_start, 0) + 1, len(ids) - 1)])
        return [i for i, r in enumerate(roles) if r == self.ids.user]

    def _user_part(self, user_pos: list[int]) -> torch.Tensor:
        ids = self.prompt_ids
        embed, hidden = torch.cat(self._embeds), torch.cat(self._hiddens)
        rows = self.parts.tts_embeds.new_empty((len(user_pos), self.parts.tts_embeds.shape[-1]))
        if not user_pos:
            return rows
        pos_t = torch.tensor(user_pos, dtype=torch.long)
        is_mm = torch.tensor([ids[i] in self.ids.multimodal for i in user_pos], dtype=torch.bool)
        source = embed[pos_t.to(embed.device)].clone()
        if is_mm.any():
            source[is_mm.to(source.device)] = hidden[pos_t[is_mm].to(hidden.device)].to(source.dtype)
        self.user_source, self.user_is_media = source.cpu().contiguous(), bytes(is_mm.tolist())
        if is_mm.any():
            rows[is_mm.to(rows.device)] = self.parts.hidden_projection(hidden[pos_t[is_mm]]).to(rows.dtype)
        if (~is_mm).any():
            rows[(~is_mm).to(rows.device)] = self.parts.text_projection(embed[pos_t[~is_mm]]).to(rows.dtype)
        return rows

    def _assistant_part(self) -> torch.Tensor:
        p = self._assistant_rows
        bos, _, pad = self.parts.tts_embeds
        text = torch.stack([p[0], p[1], p[2], pad, pad, pad, pad, bos, p[3]])
        i = self.ids
        codec_ids = torch.tensor(
            [i.codec_nothink, i.codec_think_bos, i.codec_think_eos, self.speaker_id, i.codec_pad, i.codec_bos]
        )
        codec = self.parts.codec_embed(codec_ids).to(text.dtype)
        codec = torch.cat((codec.new_zeros((3, codec.shape[-1])), codec))
        return text + codec
