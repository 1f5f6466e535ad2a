"""`ThinkerStage`: the Qwen3-Omni thinker as a stage (the shared omni/stages/multimodal/lm_stage.py) on the built-in AR engine, or with
`backend="sglang"` on SGLang's (text prompts: the thinker's text model is exported once as a
Qwen3-MoE checkpoint, see export_text.py).

args: `ThinkerArgs` (stages/args.py): `model_dir` (a Qwen3-Omni checkpoint) or, in-process, `model`
(a built `Qwen3OmniThinker`); `dtype` ("float32", "bfloat16", ...); every `EngineConfig` field.
Defaults: EOS = `<|im_end|>`; hidden-state taps 0 and the talker's `accept_hidden_layer`
when the checkpoint has a talker and the stage has a `hidden` output port.

Per request: the prompt comes from `params["prompt_token_ids"]` and/or `token_ids` chunks;
encoder outputs arrive as chunks with the keys `Qwen3OmniThinker.prepare` takes
(`audio_embeds`, `image_embeds`, `image_grid_thw`, `image_deepstack`, `video_*`); a key
that arrives in several chunks (several audios or images) is concatenated in arrival
order, which must be prompt order. Sampling: `params["sampling"][<stage name>]` (omni/stages/sampling.py).
Emits as `ARStage`: `text` {"token_ids", "text": the new text (detokenized incrementally, special
tokens skipped; with a `model_dir`)}, `hidden` taps ("layer_0", "layer_<accept>"), only for requests
that want audio (`request.wants_audio`); the request's End carries {"finish_reason", "usage":
{"prompt_tokens", "completion_tokens"}}.
"""

from __future__ import annotations

from functools import partial

from omni.kernel.errors import GraphError
from omni.kernel.stage import StageContext
from omni.models.loading import load_format, load_part
from omni.stages.multimodal.lm_stage import MultimodalLMStage as SharedThinkerStage
from omni.models.qwen3_omni.checkpoint.random_load import random_part
from omni.models.qwen3_omni.config import load_config
from omni.models.qwen3_omni.modules.thinker import Qwen3OmniThinker
from omni.models.qwen3_omni.stages.args import ThinkerArgs


class ThinkerStage(SharedThinkerStage):
    Args = ThinkerArgs
    sglang_taps_model = "omni.vendor.sglang_models:OmniQwen3MoeTaps"  # SGLang's Qwen3-MoE + the talker's taps

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.full_config = load_config(ctx.args.model_dir) if ctx.args.model_dir else None

    def sglang_model_path(self) -> str:
        """SGLang serves the thinker's text model, exported once as a Qwen3-MoE checkpoint."""
        args = self.ctx.args
        if args.quantization:
            raise GraphError(f"stage {self.ctx.name!r}: quantization={args.quantization!r} is omni's (backend "
                             "'builtin'); the sglang backend would serve bf16 weights")
        if args.sglang_model_path or not args.model_dir:
            return super().sglang_model_path()
        from omni.models.qwen3_omni.checkpoint.export_text import cached_export

        return str(cached_export(args.model_dir, weights=args.load_format != "random", root=args.sglang_export_dir or None))

    def build_model(self) -> Qwen3OmniThinker:
        args = self.ctx.args
        if args.tensor_parallel_size > 1:
            return self._tensor_parallel_model()
        if args.model is not None:
            return args.model
        if not args.model_dir:
            return super().build_model()
        return load_part(Qwen3OmniThinker, args, self.ctx.device, random=partial(random_part, "thinker"),
                         default_dtype="float32")

    def _tensor_parallel_model(self):
        """Rank 0 of `tensor_parallel_size` ranks on consecutive devices, each loading its slices."""
        from omni.placement import rank_devices
        from omni.stages.ar.tensor_parallel import CacheRecipe, ShardRecipe, TensorParallelModel

        args, config = self.ctx.args, self.engine_config()
        if not args.model_dir:
            raise GraphError(f"stage {self.ctx.name!r}: tensor_parallel_size > 1 needs args.model_dir (each rank loads it)")
        if args.quantization:
            raise GraphError(f"stage {self.ctx.name!r}: quantization={args.quantization!r} does not shard yet "
                             "(tensor_parallel_size > 1 loads bf16 weights)")
        size = config.tensor_parallel_size
        recipe = ShardRecipe("omni.models.qwen3_omni.modules.thinker_tp:build_shard", {
            "model_dir": str(args.model_dir), "dtype": args.dtype,
            "load_format": load_format(args), "seed": args.seed})
        cache = CacheRecipe(config.num_blocks, config.block_size, config.dtype, config.attention_backend)
        return TensorParallelModel.launch(recipe, size, rank_devices(self.ctx.device, size), cache)

    def checkpoint_defaults(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """EOS = `<|im_end|>`; taps 0 and the talker's `accept_hidden_layer` when there is a talker."""
        cfg = self.full_config
        if cfg is None:
            return (), ()
        return (cfg.im_end_token_id,), ((0, cfg.talker.accept_hidden_layer) if cfg.talker is not None else ())
