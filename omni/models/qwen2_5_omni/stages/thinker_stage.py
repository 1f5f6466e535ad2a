"""`ThinkerStage` of a Qwen2.5-Omni graph: the shared thinker stage (omni/stages/multimodal/lm_stage.py)
with Qwen2.5-Omni's thinker. EOS: the checkpoint's generation config (else the tokenizer's `<|im_end|>`);
taps for the talker: 0 (embeddings) and the last (the final normed hidden), when it has a talker."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from omni.models.loading import load_part
from omni.models.qwen2_5_omni.checkpoint.random_load import random_part
from omni.stages.multimodal.lm_stage import MultimodalLMStage as SharedThinkerStage
from omni.models.qwen2_5_omni.config import load_omni_config
from omni.models.qwen2_5_omni.modules.thinker import Qwen2_5OmniThinker
from omni.models.qwen2_5_omni.stages.args import ThinkerArgs


def eos_ids(model_dir: str | Path) -> tuple[int, ...]:
    """The thinker's EOS ids: generation_config.json's, else the tokenizer's `<|im_end|>`."""
    path = Path(model_dir) / "generation_config.json"
    eos = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    if eos is None:
        from omni.stages.ar.detokenizer import load_tokenizer

        eos = load_tokenizer(str(model_dir)).token_to_id("<|im_end|>")  # a `tokenizers` Tokenizer
    return tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))


class ThinkerStage(SharedThinkerStage):
    Args = ThinkerArgs

    def checkpoint_defaults(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        model_dir = self.ctx.args.model_dir
        if not model_dir:
            return (), ()
        cfg = load_omni_config(model_dir)
        taps = (0, cfg.thinker.text.num_layers) if cfg.talker is not None else ()
        return eos_ids(model_dir), taps

    def build_model(self) -> Qwen2_5OmniThinker:
        args = self.ctx.args
        if args.model is not None:
            return args.model
        if not args.model_dir:
            return super().build_model()
        return load_part(Qwen2_5OmniThinker, args, self.ctx.device,
                         random=partial(random_part, "thinker"), default_dtype="float32")
