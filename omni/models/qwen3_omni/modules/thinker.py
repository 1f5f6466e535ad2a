"""The Qwen3-Omni thinker's language model on omni's AR engine.

transformers' `Qwen3OmniMoeThinkerForConditionalGeneration` minus its encoders: a Qwen3-MoE
decoder with interleaved M-RoPE, whose prompt embeddings take the audio / image / video
encoder outputs at their placeholder tokens, and whose first decoder layers add the vision
encoder's "deepstack" features at the visual positions. The encoders run in their own
stages; this model takes their outputs as request inputs (see `Qwen3OmniThinker.prepare`).

Hidden-state taps (engine config `tap_layers`) follow transformers' `output_hidden_states`:
tap 0 = input embeddings after the multimodal merge, tap i = output of decoder layer i - 1
(before any deepstack addition), tap num_layers = the final normed hidden. The talker
needs taps 0 and `accept_hidden_layer`.

Prefix caching (`prefix_key`): a text-only sequence's KV is decided by its token ids; one with
media also by each block's M-RoPE positions, merged embeddings and deepstack rows, hashed from
host copies made once per request. Audio rows are keyed by their encoder's inputs (`audio_keys`)
instead: an audio's embeddings change in their last bits with what it was batched with, so a
conversation's earlier audio, encoded again with the new turn's, would never hit. (Each clip's
features and pad_len are its own, whatever else the request holds: stages/clip_features.py.)
"""

from __future__ import annotations

from bisect import bisect_left
from hashlib import blake2b
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from omni.kernel.errors import InvalidRequest
from omni.layers.fp8 import device_runs_fp8, resolve_state
from omni.layers.fp8_format import checkpoint_format
from omni.layers.fp8_modules import convert_shells_, quantize_at_load_
from omni.models.qwen3_omni.config import ThinkerConfig, load_config
from omni.layers.norms import RMSNorm
from omni.layers.rotary import DEFAULT_MROPE_SECTION, mrope_cos_sin, rope_inv_freq
from omni.models.qwen3_omni.modules.rope import RopeTokens, VisionGrid, rope_index
from omni.models.qwen3_omni.modules.thinker_layers import DecoderLayer, text_state_dict
from omni.models.weights import CheckpointError, load_state_dict
from omni.stages.ar.model_api import ARModel, DecodeForm, ForwardBatch, ForwardOutput, KVCacheSpec
from omni.stages.ar.sequence import Sequence


class TextModel(nn.Module):
    def __init__(self, cfg: ThinkerConfig) -> None:
        super().__init__()
        text = cfg.text
        self.embed_tokens = nn.Embedding(text.vocab_size, text.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(text, i) for i in range(text.num_layers))
        self.norm = RMSNorm(text.hidden_size, text.rms_norm_eps)


def _tensor(value: Any, dtype: torch.dtype, device) -> torch.Tensor:
    """An array, tensor, or list of them (concatenated on the token axis, -2) as one tensor."""
    if isinstance(value, (list, tuple)) and value and not isinstance(value[0], (int, float)):
        return torch.cat([_tensor(v, dtype, device) for v in value], dim=-2)
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


def _grids(value: Any, seconds: Any = None, audio_tokens: Any = None) -> list[VisionGrid]:
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


class Qwen3OmniThinker(nn.Module, ARModel):
    """Request inputs (`AREngine.add_request(..., inputs=...)`), arrays or tensors:
    `audio_embeds` [Na, H] (every audio of the prompt, in order), `image_embeds` [Ni, H] +
    `image_grid_thw` [n, 3], `video_embeds` [Nv, H] + `video_grid_thw` [n, 3] (+
    `video_second_per_grid` [n], `video_audio_tokens` [n]: each video's interleaved audio tokens),
    and the deepstack features `image_deepstack` [k, Ni, H] /
    `video_deepstack` [k, Nv, H]. A list of arrays is concatenated on the token axis.
    """

    supports_cuda_graphs = True  # decode reads no spans (deepstack rows are prompt-only), no host syncs on CUDA
    decode_form = DecodeForm(embeds=False, pos_lead=(3,), pos_dtype=torch.float32)  # ids in, M-RoPE positions
    lookahead_decode = True  # a decode step reads its ids (the engine feeds them on the device) and host-known positions

    def __init__(self, cfg: ThinkerConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.cfg = cfg
        text = cfg.text
        self.model = TextModel(cfg)
        self.lm_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False)
        self.section = tuple(text.mrope_section) or DEFAULT_MROPE_SECTION
        self.inv_freq = rope_inv_freq(text.head_dim, text.rope_theta)  # float32 always; not a buffer
        self.rope_tokens = RopeTokens(
            cfg.image_token_id, cfg.video_token_id, cfg.position_id_per_seconds, cfg.vision.spatial_merge_size,
            cfg.audio_token_id,
        )
        self.num_deepstack = len(cfg.vision.deepstack_visual_indexes)
        self.to(dtype)

    # ---- construction ----------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path, device: str = "cpu", dtype: torch.dtype | None = None,
                        quantization: str = ""):
        """FP8 weights (a checkpoint's e4m3 + block scales, or `quantization="fp8"` of a bf16 one) stay
        e4m3 on a device with FP8 kernels; elsewhere they are dequantized to `dtype` (`omni.layers.fp8`).
        Built on the meta device and filled with the tensors read straight onto `device`: no second copy
        of the model in host memory (61 GB at full size in bf16)."""
        from omni.models.qwen3_omni.checkpoint.random_load import _meta, check_materialized

        full = load_config(ckpt_dir)
        dtype = dtype or torch.float32
        fmt, keep = checkpoint_format(full.raw), device_runs_fp8(device)
        state = load_state_dict(ckpt_dir, "thinker", device=str(device), dtype=dtype, fp8=True)
        state = resolve_state(state, fmt, dtype, keep, where=f"{ckpt_dir} (thinker)")
        with _meta(dtype):
            model = cls(full.thinker, dtype)
        model.load_weights(state, assign=True)
        del state
        text = full.thinker.text
        model.inv_freq = rope_inv_freq(text.head_dim, text.rope_theta)
        check_materialized(model)
        model.eval()
        quantize_at_load_(model, quantization, fmt, keep)
        return model

    def load_weights(self, state: dict[str, torch.Tensor], assign: bool = False) -> None:
        """Copy weights named as in the checkpoint or in transformers' module (see `text_state_dict`);
        `assign`: take the tensors themselves (a model built on the meta device)."""
        ours = text_state_dict(state, self.cfg.text)
        if "lm_head.weight" not in ours and self.cfg.raw.get("text_config", {}).get("tie_word_embeddings"):
            ours["lm_head.weight"] = ours["model.embed_tokens.weight"]
        convert_shells_(self, ours)  # FP8 pairs: their linears and experts made e4m3
        want = self.state_dict()
        missing = sorted(set(want) - set(ours))
        if missing:
            raise CheckpointError(f"thinker weights missing: {missing[:8]}")
        for name, tensor in ours.items():
            if name in want and tuple(tensor.shape) != tuple(want[name].shape):
                raise CheckpointError(f"thinker.{name}: shape {tuple(tensor.shape)} != {tuple(want[name].shape)}")
        self.load_state_dict({k: ours[k] for k in want}, strict=True, assign=assign)

    # ---- ARModel ---------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def kv_cache_spec(self) -> KVCacheSpec:
        t = self.cfg.text
        return KVCacheSpec(t.num_layers, t.num_kv_heads, t.head_dim, self.dtype, self.lm_head.weight.shape[0])

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        return self.run_layers(self.step_inputs(batch), batch)

    def step_inputs(self, batch: ForwardBatch) -> dict[str, torch.Tensor | None]:
        """What the decoder layers take from the step's sequences: embeddings, positions and the
        deepstack rows (tensor_parallel.py broadcasts these to the other ranks)."""
        x = batch.inputs_embeds if batch.inputs_embeds is not None else self.embed_tokens(batch.input_ids)
        deepstack = self._deepstack_rows(batch)
        rows, feats = deepstack if deepstack is not None else (None, None)
        return {"x": x, "positions": batch.positions, "deepstack_rows": rows, "deepstack_feats": feats}

    def run_layers(self, inputs: dict[str, torch.Tensor | None], batch: ForwardBatch) -> ForwardOutput:
        """The decoder over `step_inputs`; reads only them, `batch.attend` and `batch.tap_layers`."""
        x = inputs["x"]
        cos, sin = mrope_cos_sin(self.inv_freq, inputs["positions"], self.section, x.dtype)
        rows, feats = inputs.get("deepstack_rows"), inputs.get("deepstack_feats")
        taps = {0: x} if 0 in batch.tap_layers else {}
        num_layers = len(self.model.layers)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, batch)
            if i + 1 in batch.tap_layers and i + 1 < num_layers:
                taps[i + 1] = x
            if rows is not None and i < self.num_deepstack:
                x = x.index_add(0, rows, feats[i].to(x.dtype))
        x = self.model.norm(x)
        if num_layers in batch.tap_layers:
            taps[num_layers] = x
        return ForwardOutput(x, taps)

    def _deepstack_rows(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
        rows, feats = [], []
        for span in batch.spans:
            st = span.seq.model_state
            positions = st.get("deepstack_pos")
            if not positions or span.start >= span.seq.num_prompt_tokens:
                continue
            lo, hi = bisect_left(positions, span.start), bisect_left(positions, span.end)
            if lo < hi:
                rows.append(torch.tensor(positions[lo:hi]) - span.start + span.row)
                feats.append(st["deepstack"][:, lo:hi])
        if not rows:
            return None
        return torch.cat(rows).to(self.device), torch.cat(feats, dim=1)

    # ---- per-request inputs ----------------------------------------------------------
    def prepare(self, seq: Sequence, inputs: dict[str, Any]) -> None:
        known = {"audio_embeds", "audio_keys", "image_embeds", "image_grid_thw", "video_embeds", "video_grid_thw",
                 "video_second_per_grid", "video_audio_tokens", "image_deepstack", "video_deepstack"}
        unknown = set(inputs) - known
        if unknown:
            raise InvalidRequest(f"thinker: unknown inputs {sorted(unknown)}")
        cfg, prompt = self.cfg, seq.prompt_token_ids
        ids = torch.tensor(prompt)
        merged_pos, merged_emb, merged_keys = [], [], []
        for kind, token in (("audio", cfg.audio_token_id), ("image", cfg.image_token_id), ("video", cfg.video_token_id)):
            where = torch.nonzero(ids == token).flatten()
            emb = inputs.get(f"{kind}_embeds")
            n = 0 if emb is None else _tensor(emb, self.dtype, self.device).shape[0]
            if n != len(where):
                raise InvalidRequest(f"thinker: {len(where)} {kind} placeholder tokens but {n} {kind} embeddings")
            if n:
                emb = _tensor(emb, self.dtype, self.device)
                if emb.shape[-1] != cfg.text.hidden_size:
                    raise InvalidRequest(f"thinker: {kind} embeddings of width {emb.shape[-1]}, need {cfg.text.hidden_size}")
                merged_pos.append(where)
                merged_emb.append(emb)
                keys = inputs.get(f"{kind}_keys")
                merged_keys.append(None if keys is None else _tensor(keys, torch.uint8, "cpu"))
        state = seq.model_state
        if merged_pos:
            pos = torch.cat(merged_pos)
            order = torch.argsort(pos)
            state["mm_pos"] = pos[order].tolist()
            state["mm_embeds"] = torch.cat(merged_emb)[order.to(self.device)]
            if all(k is not None and k.shape == (e.shape[0], 16) for k, e in zip(merged_keys, merged_emb)):
                state["mm_keys"] = torch.cat(merged_keys)[order]  # rows keyed by their inputs (see prefix_key)
        images = _grids(inputs.get("image_grid_thw"))
        videos = _grids(inputs.get("video_grid_thw"), inputs.get("video_second_per_grid"),
                        inputs.get("video_audio_tokens"))
        if images or videos:
            state["mrope"], state["mrope_delta"] = rope_index(prompt, self.rope_tokens, images, videos)
        self._prepare_deepstack(state, ids, inputs)

    def _prepare_deepstack(self, state: dict, ids: torch.Tensor, inputs: dict[str, Any]) -> None:
        pos, feats = [], []
        for kind, token in (("image", self.cfg.image_token_id), ("video", self.cfg.video_token_id)):
            where = torch.nonzero(ids == token).flatten()
            ds = inputs.get(f"{kind}_deepstack")
            if ds is None:
                continue
            ds = _tensor(ds, self.dtype, self.device)
            if ds.dim() != 3 or ds.shape[0] != self.num_deepstack or ds.shape[1] != len(where):
                raise InvalidRequest(
                    f"thinker: {kind}_deepstack must be [{self.num_deepstack}, {len(where)}, H], got {tuple(ds.shape)}"
                )
            pos.append(where)
            feats.append(ds)
        if pos:
            p = torch.cat(pos)
            order = torch.argsort(p)
            state["deepstack_pos"] = p[order].tolist()
            state["deepstack"] = torch.cat(feats, dim=1)[:, order.to(self.device)]

    def input_embeds(self, seq: Sequence, start: int, end: int) -> torch.Tensor | None:
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

    def prefix_key(self, seq: Sequence, start: int, end: int) -> bytes:
        """Beyond the token ids: the block's rope positions and the media rows merged or added there."""
        st = seq.model_state
        if "mrope" not in st and not st.get("mm_pos") and not st.get("deepstack_pos"):
            return b""  # plain positions, token embeddings only
        h = blake2b(self.positions(seq, start, end).contiguous().numpy().tobytes(), digest_size=16)
        for pos_key, rows_key, axis in (("mm_pos", "mm_embeds", 0), ("deepstack_pos", "deepstack", 1)):
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

    def decode_inputs(self, seqs: list[Sequence], starts: list[int]) -> tuple[torch.Tensor, None] | None:
        """Every row past its prompt: positions index + delta (token embeddings), for the whole batch
        in one tensor; otherwise (or where a subclass changed the row hooks) row by row."""
        cls = type(self)
        if cls.input_embeds is not Qwen3OmniThinker.input_embeds or cls.positions is not Qwen3OmniThinker.positions:
            return None
        if any(p < seq.num_prompt_tokens for p, seq in zip(starts, seqs)):
            return None
        deltas = [float(seq.model_state["mrope_delta"]) if "mrope" in seq.model_state else 0.0 for seq in seqs]
        pos = torch.tensor(starts, dtype=torch.float32) + torch.tensor(deltas, dtype=torch.float32)  # as `positions`
        return pos.expand(3, -1), None

    def positions(self, seq: Sequence, start: int, end: int) -> torch.Tensor:
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
