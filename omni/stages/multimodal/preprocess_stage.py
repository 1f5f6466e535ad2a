"""`PreprocessStage`: the entry stage of an omni family's graph (Qwen3-Omni, Qwen2.5-Omni). Request
params -> the thinker's prompt and the encoders' inputs, each on its own port. A family subclasses it
with its `Preprocessor` (`preprocessor`) and how an audio clip goes to its encoder (`audio_emits`).

It checks the request (task, messages, voice, modalities) as soon as it opens, so a bad request
fails before any model runs, then runs `Preprocessor` (chat template, tokenizer, Whisper log-mels,
image patches) on the compute thread. Per request it emits, in this order:

- port `audio`: each input audio's features {"features": [mel, frames] float32}, as the family's
  `audio_emits` cuts them (Qwen3-Omni: one chunk per attention window, with the clip's `pad_len`);
- port `image`: one chunk per input image {"pixels": [patches, C*T*P*P] float32, "grid_thw": [3]},
  then one per video, the same plus {"kind": "video", "second_per_grid", "audio_tokens"};
- port `grids`: {"image_grid_thw": [n, 3]} and/or {"video_grid_thw": [n, 3], "video_second_per_grid": [n],
  "video_audio_tokens": [n]} when the prompt has images or videos (the talker's M-RoPE needs them);
- port `prompt`: {"token_ids": int64 [n]} (placeholders expanded), and the request ends here.

The encode task (request.py `ENCODE`, a clip still being spoken) is a family's own
(`encode_windows`; Qwen3-Omni's). args: `PreprocessArgs` (args.py); a prompt longer than `max_prompt_tokens` is refused by its
characters at open, else by its token count before anything is sent on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni.kernel.errors import InvalidRequest, OmniError
from omni.kernel.stage import Emit, Stage, StageContext
from omni.layers.chat_template import CHARS_PER_TOKEN
from omni.stages.multimodal.preprocess import Preprocessor
from omni.stages.multimodal.request import (ENCODE, chat_messages, check_voice, completion_text, prompt_chars,
                                      wants_audio)
from omni.stages.multimodal.args import PreprocessArgs
from omni.stages.args import coerce_args
from omni.stages.threads import pin_torch_threads


@dataclass
class _Request:
    messages: list[dict[str, Any]]
    raw_text: str | None = None  # a text completion's prompt, tokenized without the chat template
    encode: bool = False  # the encode task: a spoken clip's final windows only
    ready: bool = False
    outputs: list[Emit] = field(default_factory=list)


class PreprocessStage(Stage):
    def __init__(self, ctx: StageContext) -> None:
        ctx.args = coerce_args(PreprocessArgs, ctx.args, ctx.name)
        super().__init__(ctx)
        self.voices = list(ctx.args.voices)
        self.max_batch = ctx.args.max_batch
        self.max_prompt_tokens = ctx.args.max_prompt_tokens  # the thinker's context; 0 = unbounded
        self.requests: dict[str, _Request] = {}
        self.processed = 0

    def preprocessor(self) -> Preprocessor:
        """The family's `Preprocessor` of `self.ctx.args.model_dir` (its PromptSpec)."""
        raise NotImplementedError

    def setup(self) -> None:
        pin_torch_threads(self.ctx.args.threads)
        self.pre = self.preprocessor()
        self.pre.max_video_tokens = self.max_prompt_tokens  # a video too long is refused before it is decoded
        self.pre([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])  # the template compiles once, here

    # ---- requests -------------------------------------------------------------------
    def open(self, rid: str, params: dict[str, Any]) -> None:
        if not isinstance(params, dict):
            raise InvalidRequest("request params must be an object")
        modalities = params.get("modalities")
        if modalities is not None and (not isinstance(modalities, list) or not set(modalities) <= {"text", "audio"}):
            raise InvalidRequest(f"modalities must be a list of 'text' / 'audio', got {modalities!r}")
        if modalities is not None and "audio" in modalities and not self.voices:
            raise InvalidRequest("this model (graph variant) does not produce audio; ask for modalities ['text']")
        if wants_audio(params) and self.voices:
            check_voice(params, self.voices)
        messages = chat_messages(params)
        if self.max_prompt_tokens:  # the cheap bound first: no tokenizer runs on a prompt that cannot fit
            chars = prompt_chars(messages)
            if chars > self.max_prompt_tokens * CHARS_PER_TOKEN:
                raise InvalidRequest(f"the prompt has {chars} characters: more than the model's context of "
                                     f"{self.max_prompt_tokens} tokens can hold")
        self.requests[rid] = _Request(messages, completion_text(params), encode=params.get("task") == ENCODE)

    def close_input(self, rid: str) -> None:
        if rid in self.requests:
            self.requests[rid].ready = True

    def abort(self, rid: str) -> None:
        self.requests.pop(rid, None)

    # ---- work -----------------------------------------------------------------------
    def has_work(self) -> bool:
        return any(r.ready for r in self.requests.values())

    def backlog(self) -> int:
        return sum(r.ready for r in self.requests.values())

    def step(self) -> list[Emit]:
        emits: list[Emit] = []
        for rid in [rid for rid, r in self.requests.items() if r.ready][: self.max_batch]:
            request = self.requests.pop(rid)
            try:
                emits.extend(self.encode_windows(rid, request.messages) if request.encode
                             else self.process(rid, request.messages, request.raw_text))
            except OmniError as exc:
                emits.append(Emit(rid, error=str(exc), error_kind=exc.kind))
            except Exception as exc:  # a broken input (e.g. an undecodable image) fails only its request
                emits.append(Emit(rid, error=f"preprocessing failed: {type(exc).__name__}: {exc}",
                                  error_kind="invalid_request"))
            self.processed += 1
        return emits

    def process(self, rid: str, messages: list[dict[str, Any]], raw_text: str | None = None) -> list[Emit]:
        inputs = self.pre.raw(raw_text) if raw_text is not None else self.pre(messages)
        if self.max_prompt_tokens and len(inputs.input_ids) > self.max_prompt_tokens:
            raise InvalidRequest(f"the prompt is {len(inputs.input_ids)} tokens; the model's context is "
                                 f"{self.max_prompt_tokens} tokens")
        emits = [e for f in inputs.audio_features for e in self.audio_emits(rid, f)]
        for image in inputs.images:
            emits.append(Emit(rid, "image", {"pixels": image.pixels,
                                             "grid_thw": np.asarray(image.grid_thw, dtype=np.int64)}))
        for video, clip in zip(inputs.videos, inputs.video_audio):
            audio_tokens = 0 if clip is None else inputs.audio_token_counts[clip]
            emits.append(Emit(rid, "image", {"pixels": video.pixels, "grid_thw": np.asarray(video.grid_thw, np.int64),
                                             "kind": "video", "second_per_grid": video.second_per_grid,
                                             "audio_tokens": audio_tokens}))
        if inputs.images or inputs.videos:
            emits.append(Emit(rid, "grids", _grids(inputs)))
        emits.append(Emit(rid, "prompt", {"token_ids": inputs.input_ids}, finish=True))
        return emits

    def audio_emits(self, rid: str, features: np.ndarray) -> list[Emit]:
        """One audio clip's features for the audio encoder (port `audio`): one chunk by default."""
        return [Emit(rid, "audio", {"features": features})]

    def encode_windows(self, rid: str, messages: list[dict[str, Any]]) -> list[Emit]:
        raise InvalidRequest("this model does not encode audio ahead of a request (the encode task)")

    def stats(self) -> dict[str, Any]:
        return {"open": len(self.requests), "ready": self.backlog(), "processed": self.processed}



def _grids(inputs) -> dict[str, np.ndarray]:
    out = {"image_grid_thw": inputs.image_grid_thw} if inputs.images else {}
    if inputs.videos:
        out["video_grid_thw"] = np.array([v.grid_thw for v in inputs.videos], dtype=np.int64).reshape(-1, 3)
        out["video_second_per_grid"] = np.array([v.second_per_grid for v in inputs.videos], dtype=np.float64)
        out["video_audio_tokens"] = np.array([0 if c is None else inputs.audio_token_counts[c]
                                              for c in inputs.video_audio], dtype=np.int64)
    return out
