"""The AR-engine hooks of a multimodal thinker (Qwen3-Omni's, Qwen2.5-Omni's): its prompt embeddings
take the encoders' rows at their placeholder tokens, and its positions are M-RoPE.

`MultimodalPrompt` is a mixin for an `ARModel` (nn.Module first in the bases) that has `embed_tokens`,
`dtype`, `device`, `hidden_size`, `media_tokens` ((kind, placeholder id) for audio, image and video) and
`rope_tokens` (omni/layers/mrope_index.py). `ThinkerLM` adds those (and the rest of the ARModel surface,
the decoder loop with its taps, checked weight loading) for a thinker with `cfg` (`text`: a DecoderConfig,
the placeholder ids), `model` (`embed_tokens`, `layers`, `norm`) and `lm_head`. Request inputs, arrays or tensors: `<kind>_embeds` [N, H]
(every item of that kind in the prompt, in order; a list of arrays is concatenated on the token axis),
`<kind>_keys` [N, 16] uint8 (what decided each row, for the prefix cache), `image_grid_thw` /
`video_grid_thw` [n, 3] and `video_second_per_grid` [n]. A model adds its own inputs by extending
`input_keys` and overriding `prepare_extra` (Qwen3-Omni's deepstack rows), and more rows the prefix
key must cover through `prefix_rows`.

Prefix caching (`prefix_key`): a text-only sequence's KV is decided by its token ids; one with media
also by each block's M-RoPE positions and merged rows, hashed from host copies made once per request.
Audio rows are keyed by their encoder's inputs (`audio_keys`) instead: an audio's embeddings change in
their last bits with what it was batched with, so a conversation's earlier audio, encoded again with the
new turn's, would never hit.
"""

from __future__ import annotations

from bisect import bisect_left
from hashlib import blake2b
from typing import Any

import numpy as np
import torch

from omni.kernel.errors import InvalidRequest
from omni.layers.mrope_index import VisionGrid, rope_index


def as_tensor(value: Any, dtype: torch.dtype, device) -> torch.Tensor:
    """An array, tensor, or list of them (concatenated on the token axis, -2) as one tensor."""
    if isinstance(value, (list, tuple)) and value and not isinstance(value[0], (int, float)):
        return torch.cat([as_tensor(v, dtype, device) for v in value], dim=-2)
    t = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))
    return t.to(device=device, dtype=dtype)


def _flat(value: Any, dtype) -> np.ndarray:
    """Every number of an array, tensor, nested list, or list of those, flattened in order."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().astype(dtype).reshape(-1)
    if isinstance(value, (list, tuple)):
        parts = [_flat(v, dtype) for v in value]
        return np.concatenate(parts) if parts else np.zeros(0, dtype)
    return np.asarray(value, dtype=dtype).reshape(-1)


def grids(value: Any, seconds: Any = None, audio_tokens: Any = None) -> list[VisionGrid]:
    if value is None:
        return []
    rows = _flat(value, np.int64)
    if rows.size % 3:
        raise InvalidRequest(f"grid_thw must have 3 numbers per image or video, got {rows.size}")
    rows = rows.reshape(-1, 3)
    secs = [1.0] * len(rows) if seconds is None else _flat(seconds, np.float64).tolist()
    audio = [0] * len(rows) if audio_tokens is None else _flat(audio_tokens, np.int64).tolist()
    if len(secs) != len(rows) or len(audio) != len(rows):
        raise InvalidRequest(f"{len(rows)} video grids but {len(secs)} seconds-per-grid values and "
                             f"{len(audio)} audio token counts")
    return [VisionGrid(int(t), int(h), int(w), float(s), int(a)) for (t, h, w), s, a in zip(rows, secs, audio)]


class MultimodalPrompt:
    input_keys = frozenset({"audio_embeds", "audio_keys", "image_embeds", "image_grid_thw", "video_embeds",
                            "video_grid_thw", "video_second_per_grid", "video_audio_tokens"})
    prefix_rows: tuple[tuple[str, str, int], ...] = (("mm_pos", "mm_embeds", 0),)  # (positions, rows, token axis)
    name = "thinker"

    def prepare(self, seq, inputs: dict[str, Any]) -> None:
        unknown = set(inputs) - self.input_keys
        if unknown:
            raise InvalidRequest(f"{self.name}: unknown inputs {sorted(unknown)}")
        prompt = seq.prompt_token_ids
        ids = torch.tensor(prompt)
        merged_pos, merged_emb, merged_keys = [], [], []
        for kind, token in self.media_tokens:
            where = torch.nonzero(ids == token).flatten()
            emb = inputs.get(f"{kind}_embeds")
            n = 0 if emb is None else as_tensor(emb, self.dtype, self.device).shape[0]
            if n != len(where):
                raise InvalidRequest(f"{self.name}: {len(where)} {kind} placeholder tokens but {n} {kind} embeddings")
            if n:
                emb = as_tensor(emb, self.dtype, self.device)
                if emb.shape[-1] != self.hidden_size:
                    raise InvalidRequest(f"{self.name}: {kind} embeddings of width {emb.shape[-1]}, need {self.hidden_size}")
                merged_pos.append(where)
                merged_emb.append(emb)
                keys = inputs.get(f"{kind}_keys")
                merged_keys.append(None if keys is None else as_tensor(keys, torch.uint8, "cpu"))
        state = seq.model_state
        if merged_pos:
            pos = torch.cat(merged_pos)
            order = torch.argsort(pos)
            state["mm_pos"] = pos[order].tolist()
            state["mm_embeds"] = torch.cat(merged_emb)[order.to(self.device)]
            if all(k is not None and k.shape == (e.shape[0], 16) for k, e in zip(merged_keys, merged_emb)):
                state["mm_keys"] = torch.cat(merged_keys)[order]  # rows keyed by their inputs (see prefix_key)
        images = grids(inputs.get("image_grid_thw"))
        videos = grids(inputs.get("video_grid_thw"), inputs.get("video_second_per_grid"),
                       inputs.get("video_audio_tokens"))  # each video's interleaved audio tokens (use_audio_in_video)
        if images or videos:
            state["mrope"], state["mrope_delta"] = rope_index(prompt, self.rope_tokens, images, videos)
        self.prepare_extra(state, ids, inputs)

    def prepare_extra(self, state: dict, ids: torch.Tensor, inputs: dict[str, Any]) -> None:
        """A model's own request inputs (after the media rows and positions)."""

    def input_embeds(self, seq, start: int, end: int) -> torch.Tensor | None:
        positions = seq.model_state.get("mm_pos")
        if not positions or start >= seq.num_prompt_tokens:
            return None
        lo, hi = bisect_left(positions, start), bisect_left(positions, end)
        if lo == hi:
            return None
        ids = torch.tensor(seq.token_ids(start, end), device=self.device)
        emb = self.embed_tokens(ids).clone()
        rows = torch.tensor(positions[lo:hi], device=self.device) - start
        emb[rows] = seq.model_state["mm_embeds"][lo:hi]
        return emb

    def prefix_key(self, seq, start: int, end: int) -> bytes:
        """Beyond the token ids: the block's rope positions and the media rows merged or added there."""
        st = seq.model_state
        if "mrope" not in st and not any(st.get(pos_key) for pos_key, _, _ in self.prefix_rows):
            return b""  # plain positions, token embeddings only
        h = blake2b(self.positions(seq, start, end).contiguous().numpy().tobytes(), digest_size=16)
        for pos_key, rows_key, axis in self.prefix_rows:
            positions = st.get(pos_key)
            if not positions:
                continue
            lo, hi = bisect_left(positions, start), bisect_left(positions, end)
            host = st.get("mm_keys") if rows_key == "mm_embeds" else None  # rows keyed by their inputs
            host = host if host is not None else st.get(f"{rows_key}_host")
            if host is None:  # one copy per request, only for hashing
                host = st[f"{rows_key}_host"] = st[rows_key].detach().cpu().contiguous()
            rows = host[lo:hi] if axis == 0 else host[:, lo:hi]
            h.update(rows_key.encode() + repr(positions[lo:hi]).encode())
            h.update(rows.contiguous().view(torch.uint8).numpy().tobytes())
        return h.digest()

    def decode_inputs(self, seqs: list, starts: list[int]) -> tuple[torch.Tensor, None] | None:
        """Every row past its prompt: positions index + delta (token embeddings), for the whole batch
        in one tensor; otherwise (or where a subclass changed the row hooks) row by row."""
        cls = type(self)
        if cls.input_embeds is not MultimodalPrompt.input_embeds or cls.positions is not MultimodalPrompt.positions:
            return None
        if any(p < seq.num_prompt_tokens for p, seq in zip(starts, seqs)):
            return None
        deltas = [float(seq.model_state["mrope_delta"]) if "mrope" in seq.model_state else 0.0 for seq in seqs]
        pos = torch.tensor(starts, dtype=torch.float32) + torch.tensor(deltas, dtype=torch.float32)  # as `positions`
        return pos.expand(3, -1), None

    def positions(self, seq, start: int, end: int) -> torch.Tensor:
        """[3, end - start] float32: the prompt's M-RoPE positions, then index + delta."""
        mrope = seq.model_state.get("mrope")
        if mrope is None:
            return torch.arange(start, end, dtype=torch.float32).expand(3, -1)
        n = seq.num_prompt_tokens
        parts = []
        if start < n:
            parts.append(mrope[:, start : min(end, n)])
        if end > n:
            tail = torch.arange(max(start, n), end, dtype=torch.float32) + seq.model_state["mrope_delta"]
            parts.append(tail.expand(3, -1))
        return torch.cat(parts, dim=1)


class ThinkerLM(MultimodalPrompt):
    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def hidden_size(self) -> int:
        return self.cfg.text.hidden_size

    @property
    def media_tokens(self) -> tuple[tuple[str, int], ...]:
        cfg = self.cfg
        return (("audio", cfg.audio_token_id), ("image", cfg.image_token_id), ("video", cfg.video_token_id))

    def kv_cache_spec(self):
        from omni.stages.ar.model_api import KVCacheSpec

        t = self.cfg.text
        return KVCacheSpec(t.num_layers, t.num_kv_heads, t.head_dim, self.dtype, self.lm_head.weight.shape[0])

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def decode_layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch, after_layer=None):
        """The decoder over `x` with the step's taps (transformers' `output_hidden_states` indexing: 0 the
        input, i the output of layer i - 1, num_layers the final normed hidden); `after_layer(i, x)` may
        change a layer's output after its tap (Qwen3-Omni's deepstack rows)."""
        from omni.stages.ar.model_api import ForwardOutput

        taps = {0: x} if 0 in batch.tap_layers else {}
        num_layers = len(self.model.layers)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, batch)
            if i + 1 in batch.tap_layers and i + 1 < num_layers:
                taps[i + 1] = x
            if after_layer is not None:
                x = after_layer(i, x)
        x = self.model.norm(x)
        if num_layers in batch.tap_layers:
            taps[num_layers] = x
        return ForwardOutput(x, taps)

    def weight_problems(self, ours: dict[str, torch.Tensor]) -> str:
        """What keeps `ours` from loading into this module ("" when nothing does)."""
        want = self.state_dict()
        missing = sorted(set(want) - set(ours))
        if missing:
            return f"thinker weights missing: {missing[:8]}"
        for name, tensor in ours.items():
            if name in want and tuple(tensor.shape) != tuple(want[name].shape):
                return f"thinker.{name}: shape {tuple(tensor.shape)} != {tuple(want[name].shape)}"
        return ""
