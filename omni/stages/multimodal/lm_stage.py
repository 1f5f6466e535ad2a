"""`MultimodalLMStage`: an omni family's thinker on the AR engine (Qwen3-Omni's, Qwen2.5-Omni's): what the
families' thinker stages share. A family subclasses it with its model (`build_model`), its EOS and the
taps its talker takes (`checkpoint_defaults`).

Per request: the prompt comes from `params["prompt_token_ids"]` and/or `token_ids` chunks;
encoder outputs arrive as chunks with the keys the thinker's `prepare` takes (`audio_embeds`,
`image_embeds`, `image_grid_thw`, ...); a key that arrives in several chunks (several audios or
images) is concatenated in arrival order, which must be prompt order. Sampling:
`params["sampling"][<stage name>]` (omni/stages/sampling.py). Emits as `ARStage`: `text`
{"token_ids", "text": the new text (detokenized incrementally, special tokens skipped; with a
`model_dir`)}, `hidden` taps only for requests that want audio (`request.wants_audio`); the
request's End carries {"finish_reason", "usage": {"prompt_tokens", "completion_tokens"}}.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omni.kernel.stage import Emit, StageContext
from omni.layers.fused_ops import use_fused_ops
from omni.layers.moe_routed import use_moe_backend
from omni.stages.multimodal.request import ENCODE, wants_audio
from omni.stages.ar.config import EngineConfig
from omni.stages.ar.detokenizer import TextStream, load_tokenizer
from omni.stages.ar.engine import StepOutput
from omni.stages.ar.logprobs import describe
from omni.stages.ar.stage import ARStage, copy_input


class MultimodalLMStage(ARStage):
    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.tokenizer = None
        self._texts: dict[str, TextStream] = {}

    def checkpoint_defaults(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(EOS ids, the taps the talker takes) the checkpoint says, for args that leave them empty."""
        return (), ()

    def setup(self) -> None:
        use_fused_ops(self.ctx.args.fused_ops)  # once per process, before any forward
        use_moe_backend(self.ctx.args.moe_backend)
        super().setup()

    def engine_ready(self) -> None:
        if self.ctx.args.model_dir:
            self.tokenizer = load_tokenizer(self.ctx.args.model_dir)

    def engine_config(self) -> EngineConfig:
        """The args' engine settings; EOS and taps the args leave empty come from the checkpoint."""
        config = super().engine_config()
        eos, taps = self.checkpoint_defaults()
        config = dataclasses.replace(config, eos_token_ids=config.eos_token_ids or eos)
        if taps and self.hidden_port in self.ctx.out_ports and not config.tap_layers:
            config = dataclasses.replace(config, tap_layers=taps)
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
