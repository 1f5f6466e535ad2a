"""`PreprocessStage`: the entry stage of a Qwen3-TTS graph. Request params -> the talker's prompt ids.

It checks the request when it opens (text, voice, language, instructions against the
checkpoint's kind), so a bad request fails before any model runs, then tokenizes the
reference's text formats on its compute thread. Per request it emits:

- port `prompt`: {"input_ids", "instruct_ids" (or None), "language", "speaker" (CustomVoice),
  "non_streaming"}, and the request ends here: that also ends the `voice` edge of a Base graph, whose
  voice stage reads its voice (an uploaded one, an inline clip) from the params it was opened with.
  A voice-creation request (task "voice", Base only) sends nothing: only the voice stage runs.

args: `model_dir`; `max_batch` (requests tokenized per step).
"""

from __future__ import annotations

from typing import Any

from omni.kernel.errors import InvalidRequest, OmniError
from omni.kernel.stage import Emit, Stage, StageContext
from omni.models.qwen3_tts.config import load_config
from omni.models.qwen3_tts.modules.prompt import language_id
from omni.models.qwen3_tts.request import (
    assistant_text, instruct_text, instructions_of, load_tokenizer, non_streaming_of, speech_text, tokenize,
)
from omni.models.qwen3_tts.stages.args import TTSPreprocessArgs
from omni.stages.args import coerce_args
from omni.stages.threads import pin_torch_threads


class PreprocessStage(Stage):
    def __init__(self, ctx: StageContext) -> None:
        ctx.args = coerce_args(TTSPreprocessArgs, ctx.args, ctx.name)
        super().__init__(ctx)
        self.max_batch = ctx.args.max_batch
        self.requests: dict[str, dict[str, Any]] = {}
        self.ready: list[str] = []
        self.processed = 0

    def setup(self) -> None:
        pin_torch_threads(self.ctx.args.threads)
        self.cfg = load_config(self.ctx.args.model_dir)
        self.tokenizer = load_tokenizer(self.ctx.args.model_dir)

    # ---- requests -------------------------------------------------------------------
    def open(self, rid: str, params: dict[str, Any]) -> None:
        if not isinstance(params, dict):
            raise InvalidRequest("request params must be an object")
        cfg = self.cfg
        if params.get("task") == "voice":  # voice creation: the voice stage reads its clip from the params
            if cfg.kind != "base":
                raise InvalidRequest("only a Base (voice cloning) checkpoint creates voices")
            self.requests[rid] = {"task": "voice"}
            return
        text = speech_text(params)
        instruct = instructions_of(params)
        language = str(params.get("language") or "auto")
        speaker = None
        if cfg.kind == "custom_voice":
            voice = params.get("voice") or cfg.voices[0]
            if not isinstance(voice, str) or voice.lower() not in cfg.speakers:
                raise InvalidRequest(f"unknown voice {voice!r}; this model's voices are: {', '.join(cfg.voices)}")
            speaker = voice.lower()
            if cfg.size in "0b6":  # the reference's test, verbatim: the 0.6B CustomVoice (or no size) takes none
                instruct = None
        elif cfg.kind == "base" and instruct is not None:
            raise InvalidRequest("instructions are not supported by a Base (voice cloning) checkpoint")
        language_id(cfg, language, speaker)  # an unknown language fails here
        self.requests[rid] = {"text": text, "instruct": instruct, "language": language, "speaker": speaker,
                              "non_streaming": non_streaming_of(params, cfg.kind)}

    def close_input(self, rid: str) -> None:
        if rid in self.requests:
            self.ready.append(rid)

    def abort(self, rid: str) -> None:
        self.requests.pop(rid, None)

    # ---- work -----------------------------------------------------------------------
    def has_work(self) -> bool:
        return any(rid in self.requests for rid in self.ready)

    def backlog(self) -> int:
        return len(self.ready)

    def step(self) -> list[Emit]:
        emits: list[Emit] = []
        batch, self.ready = self.ready[: self.max_batch], self.ready[self.max_batch:]
        for rid in batch:
            request = self.requests.pop(rid, None)
            if request is None:
                continue
            try:
                emits.extend(self.process(rid, request))
            except OmniError as exc:
                emits.append(Emit(rid, error=str(exc), error_kind=exc.kind))
            self.processed += 1
        return emits

    def process(self, rid: str, r: dict[str, Any]) -> list[Emit]:
        if r.get("task") == "voice":
            return [Emit(rid, finish=True)]  # ends the voice edge: the voice stage answers alone
        prompt = {"input_ids": tokenize(self.tokenizer, assistant_text(r["text"])),
                  "instruct_ids": tokenize(self.tokenizer, instruct_text(r["instruct"])) if r["instruct"] else None,
                  "language": r["language"], "speaker": r["speaker"], "non_streaming": r["non_streaming"]}
        return [Emit(rid, "prompt", prompt, finish=True)]  # ends the voice edge too (Base graphs)

    def stats(self) -> dict[str, Any]:
        return {"open": len(self.requests), "ready": self.backlog(), "processed": self.processed}
