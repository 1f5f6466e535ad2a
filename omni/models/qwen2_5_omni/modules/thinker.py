"""The Qwen2.5-Omni thinker's language model on omni's AR engine.

transformers' `Qwen2_5OmniThinkerForConditionalGeneration` minus its encoders: a dense Qwen2.5 decoder
(q/k/v biases, no q/k norms) with M-RoPE in contiguous sections (Qwen2-VL's layout), whose prompt
embeddings take the audio / image (/ video) encoder outputs at their placeholder tokens. The encoders
run in their own stages; their outputs arrive as request inputs (omni/layers/multimodal_lm.py, which
also gives the positions and prefix keys). Video rows and grids are taken as Qwen3-Omni's are; their
temporal positions are whole numbers, as the reference rounds them, and a video's audio track
interleaves with it in chunks of `seconds_per_chunk` (omni/layers/mrope_index.py, `audio_chunk`).

Hidden-state taps follow transformers' `output_hidden_states`: tap 0 = the input embeddings after the
multimodal merge, tap i = the output of decoder layer i - 1, tap num_layers = the final normed hidden.
The talker takes taps 0 and num_layers.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from omni.layers.decoder_layer import DecoderLayer, text_state_dict
from omni.layers.mrope_index import RopeTokens
from omni.layers.multimodal_lm import ThinkerLM
from omni.layers.norms import RMSNorm
from omni.layers.rotary import mrope_cos_sin, rope_inv_freq
from omni.models.qwen2_5_omni.config import ThinkerConfig, load_omni_config
from omni.models.weights import CheckpointError, load_state_dict
from omni.stages.ar.model_api import ARModel, DecodeForm, ForwardBatch, ForwardOutput

DEFAULT_SECTION = (16, 24, 24)  # what transformers uses when the config has no mrope_section


class TextModel(nn.Module):
    def __init__(self, cfg: ThinkerConfig) -> None:
        super().__init__()
        text = cfg.text
        self.embed_tokens = nn.Embedding(text.vocab_size, text.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(text, i, qwen2=True) for i in range(text.num_layers))
        self.norm = RMSNorm(text.hidden_size, text.rms_norm_eps)


class Qwen2_5OmniThinker(nn.Module, ThinkerLM, ARModel):
    supports_cuda_graphs = True  # decode reads no spans, no host syncs on CUDA
    decode_form = DecodeForm(embeds=False, pos_lead=(3,), pos_dtype=torch.float32)  # ids in, M-RoPE positions
    lookahead_decode = True  # a decode step reads its ids (fed on the device) and host-known positions (lookahead.py)

    def __init__(self, cfg: ThinkerConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.cfg = cfg
        text = cfg.text
        self.model = TextModel(cfg)
        self.lm_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False)
        self.section = tuple(text.mrope_section) or DEFAULT_SECTION
        self.inv_freq = rope_inv_freq(text.head_dim, text.rope_theta)  # float32 always; not a buffer
        self.rope_tokens = RopeTokens(cfg.image_token_id, cfg.video_token_id, cfg.position_id_per_seconds,
                                      cfg.vision.spatial_merge_size, integer_time=True, audio_token_id=cfg.audio_token_id,
                                      audio_chunk=int(cfg.position_id_per_seconds * cfg.seconds_per_chunk))
        self.to(dtype)

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path, device: str = "cpu", dtype: torch.dtype | None = None):
        """Built on the meta device and filled with the tensors read straight onto `device`."""
        cfg = load_omni_config(ckpt_dir).thinker
        dtype = dtype or torch.float32
        state = load_state_dict(ckpt_dir, "thinker", device=str(device), dtype=dtype)
        with torch.device("meta"):
            model = cls(cfg, dtype)
        model.load_weights(state, assign=True)
        model.inv_freq = rope_inv_freq(cfg.text.head_dim, cfg.text.rope_theta)
        return model.eval()

    def load_weights(self, state: dict[str, torch.Tensor], assign: bool = False) -> None:
        """Weights named as in the checkpoint (`thinker.model.layers...`) or in transformers' modules."""
        ours = text_state_dict(state, self.cfg.text)
        if "lm_head.weight" not in ours and self.cfg.tie_word_embeddings:
            ours["lm_head.weight"] = ours["model.embed_tokens.weight"]
        if problem := self.weight_problems(ours):
            raise CheckpointError(problem)
        self.load_state_dict({k: ours[k] for k in self.state_dict()}, strict=True, assign=assign)

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        x = batch.inputs_embeds if batch.inputs_embeds is not None else self.embed_tokens(batch.input_ids)
        cos, sin = mrope_cos_sin(self.inv_freq, batch.positions, self.section, x.dtype, interleaved=False)
        return self.decode_layers(x, cos, sin, batch)
