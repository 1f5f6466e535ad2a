"""The Qwen3-Omni thinker's language model on omni's AR engine.

transformers' `Qwen3OmniMoeThinkerForConditionalGeneration` minus its encoders: a Qwen3-MoE
decoder with interleaved M-RoPE, whose prompt embeddings take the audio / image / video
encoder outputs at their placeholder tokens, and whose first decoder layers add the vision
encoder's "deepstack" features at the visual positions. The encoders run in their own
stages; this model takes their outputs as request inputs (see `MultimodalPrompt`).

Hidden-state taps (engine config `tap_layers`) follow transformers' `output_hidden_states`:
tap 0 = input embeddings after the multimodal merge, tap i = output of decoder layer i - 1
(before any deepstack addition), tap num_layers = the final normed hidden. The talker
needs taps 0 and `accept_hidden_layer`.

The multimodal merge, M-RoPE positions and prefix keys are the shared `MultimodalPrompt`
(omni/layers/multimodal_lm.py); the deepstack rows are this model's own (`prepare_extra`).
"""

from __future__ import annotations

from bisect import bisect_left
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omni.kernel.errors import InvalidRequest
from omni.layers.fp8 import device_runs_fp8, resolve_state
from omni.layers.fp8_format import checkpoint_format
from omni.layers.fp8_modules import convert_shells_, quantize_at_load_
from omni.models.qwen3_omni.config import ThinkerConfig, load_config
from omni.layers.norms import RMSNorm
from omni.layers.rotary import DEFAULT_MROPE_SECTION, mrope_cos_sin, rope_inv_freq
from omni.layers.multimodal_lm import MultimodalPrompt, ThinkerLM, as_tensor
from omni.layers.mrope_index import RopeTokens
from omni.models.qwen3_omni.modules.thinker_layers import DecoderLayer, text_state_dict
from omni.models.weights import CheckpointError, load_state_dict
from omni.stages.ar.model_api import ARModel, DecodeForm, ForwardBatch, ForwardOutput


class TextModel(nn.Module):
    def __init__(self, cfg: ThinkerConfig) -> None:
        super().__init__()
        text = cfg.text
        self.embed_tokens = nn.Embedding(text.vocab_size, text.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(text, i) for i in range(text.num_layers))
        self.norm = RMSNorm(text.hidden_size, text.rms_norm_eps)


class Qwen3OmniThinker(nn.Module, ThinkerLM, ARModel):
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
            audio_token_id=cfg.audio_token_id,
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
        from omni.layers.random_init import check_materialized, meta

        full = load_config(ckpt_dir)
        dtype = dtype or torch.float32
        fmt, keep = checkpoint_format(full.raw), device_runs_fp8(device)
        state = load_state_dict(ckpt_dir, "thinker", device=str(device), dtype=dtype, fp8=True)
        state = resolve_state(state, fmt, dtype, keep, where=f"{ckpt_dir} (thinker)")
        with meta(dtype):
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
        if problem := self.weight_problems(ours):
            raise CheckpointError(problem)
        self.load_state_dict({k: ours[k] for k in self.state_dict()}, strict=True, assign=assign)

    # ---- ARModel (the rest: ThinkerLM) ----------------------------------------------
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
        add = None
        if rows is not None:
            add = lambda i, x: x.index_add(0, rows, feats[i].to(x.dtype)) if i < self.num_deepstack else x  # noqa: E731
        return self.decode_layers(x, cos, sin, batch, add)

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

    # ---- per-request inputs (the rest: MultimodalPrompt) ------------------------------
    input_keys = MultimodalPrompt.input_keys | {"image_deepstack", "video_deepstack"}
    prefix_rows = MultimodalPrompt.prefix_rows + (("deepstack_pos", "deepstack", 1),)

    def prepare_extra(self, state: dict, ids: torch.Tensor, inputs: dict[str, Any]) -> None:
        pos, feats = [], []
        for kind, token in (("image", self.cfg.image_token_id), ("video", self.cfg.video_token_id)):
            where = torch.nonzero(ids == token).flatten()
            ds = inputs.get(f"{kind}_deepstack")
            if ds is None:
                continue
            ds = as_tensor(ds, self.dtype, self.device)
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
