"""`ThinkerStage`: the Qwen3-Omni thinker as a stage on the built-in AR engine, or with
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

import dataclasses
from functools import partial
from typing import Any

from omni.kernel.errors import GraphError
from omni.kernel.stage import Emit, StageContext
from omni.models.qwen3_omni.config import load_config
from omni.models.qwen3_omni.request import ENCODE, wants_audio
from omni.layers.fused_ops import use_fused_ops
from omni.layers.moe_routed import use_moe_backend
from omni.models.loading import load_format, load_part
from omni.models.qwen3_omni.checkpoint.random_load import random_part
from omni.models.qwen3_omni.stages.args import ThinkerArgs
from omni.models.qwen3_omni.modules.thinker import Qwen3OmniThinker
from omni.stages.ar.config import EngineConfig
from omni.stages.ar.detokenizer import TextStream, load_tokenizer
from omni.stages.ar.engine import StepOutput
from omni.stages.ar.logprobs import describe
from omni.stages.ar.stage import ARStage, copy_input


class ThinkerStage(ARStage):
    Args = ThinkerArgs
    sglang_taps_model = "omni.vendor.sglang_models:OmniQwen3MoeTaps"  # SGLang's Qwen3-MoE + the talker's taps

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.full_config = load_config(ctx.args.model_dir) if ctx.args.model_dir else None
        self.tokenizer = None
        self._texts: dict[str, TextStream] = {}

    def setup(self) -> None:
        use_fused_ops(self.ctx.args.fused_ops)  # once per process, before any forward
        use_moe_backend(self.ctx.args.moe_backend)
        super().setup()

    def engine_ready(self) -> None:
        if self.ctx.args.model_dir:
            self.tokenizer = load_tokenizer(self.ctx.args.model_dir)

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

    def engine_config(self) -> EngineConfig:
        """The args' engine settings; EOS and taps the args leave empty come from the checkpoint."""
        config, cfg = super().engine_config(), self.full_config
        if cfg is not None:
            config = dataclasses.replace(config, eos_token_ids=config.eos_token_ids or (cfg.im_end_token_id,))
            if cfg.talker is not None and self.hidden_port in self.ctx.out_ports and not config.tap_layers:
                config = dataclasses.replace(config, tap_layers=(0, cfg.talker.accept_hidden_layer))
        return config

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        pending = self._pending.get(rid)
        if pending is None:
            return
        for key, value in data.items():
            if key == "token_ids":
                pending.token_ids.extend(int(t) for t in value)
            else:
                pending.inputs.setdefault(key, []).append(copy_input(value))

    def wants_hidden(self, params: dict[str, Any]) -> bool:
        """Taps feed the talker: none for a request that asked for text only."""
        return super().wants_hidden(params) and wants_audio(params)

    def warm_requests(self) -> list:
        """Greedy prompts of each prefill bucket's length (plain token ids, no media)."""
        sampling = {"temperature": 0, "max_tokens": 2, "ignore_eos": True}
        return [({"prompt_token_ids": [11] * n, "sampling": {self.ctx.name: sampling}}, [])
                for n in self.warm_lengths()]

    def submit(self, rid: str, params: dict[str, Any], token_ids: list[int], inputs: dict[str, Any]) -> None:
        if params.get("task") == ENCODE:  # it only filled the audio encoder's cache: nothing to say
            self._errors += [Emit(rid, self.text_port, {"token_ids": [], "finish_reason": "stop"}), Emit(rid, finish=True)]
            return
        super().submit(rid, params, token_ids, inputs)
        self._texts[rid] = TextStream(self.tokenizer)

    def abort(self, rid: str) -> None:
        self._texts.pop(rid, None)
        super().abort(rid)

    def emits_for(self, out: StepOutput) -> list[Emit]:
        emits = super().emits_for(out)
        stream = self._texts.get(out.rid)
        if stream is None:
            return emits
        for emit in emits:
            if emit.port == self.text_port and emit.data is not None:
                ids = emit.data["token_ids"]
                if self.tokenizer is None:
                    stream.ids.extend(ids)
                else:
                    text = stream.push(ids)
                    emit.data["text"] = text + stream.flush() if out.finished else text
                    if out.logprobs:  # OpenAI's entries, token text included
                        emit.data["logprobs"] = describe(self.tokenizer, out.logprobs)
            if emit.finish:
                usage = {"prompt_tokens": out.num_prompt_tokens, "completion_tokens": len(stream.ids)}
                emit.end_meta = {"finish_reason": out.finish_reason, "usage": usage}
                del self._texts[out.rid]
        return emits
