"""A one-stage model family: the answer is the prompt reversed, streamed one word per step.

It shows the whole contract of a plugin family: a `Stage` subclass (pure: told about requests,
stepped, returns `Emit`s), its typed args, and `build(model_dir, variant, **options) -> (Graph, ModelInfo)`.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omni.kernel.errors import InvalidRequest
from omni.kernel.graph import OUT, EdgeSpec, Graph, StageSpec
from omni.models.registry import ModelInfo
from omni.kernel.stage import Emit, Stage, StageContext
from omni.stages.args import StageArgs, coerce_args

MODEL_ID = "omni-example-reverse"


def prompt_text(params: dict[str, Any]) -> str:
    """The text of the last user message (chat) or `input` (speech-style requests)."""
    if isinstance(params.get("input"), str):
        return params["input"]
    for message in reversed(params.get("messages") or []):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        return " ".join(part.get("text", "") for part in content or [] if part.get("type") == "text")
    return ""


@dataclass
class ReverseArgs(StageArgs):
    """The stage's args (this module imports no torch: omni checks graphs against it)."""

    upper: bool = False  # answer in capitals


class ReverseStage(Stage):
    """Emits the prompt's characters in reverse order, one word (a "token") per step and request."""

    def __init__(self, ctx: StageContext) -> None:
        ctx.args = coerce_args(ReverseArgs, ctx.args, ctx.name)  # a dict given in-process, checked alike
        super().__init__(ctx)

    def setup(self) -> None:
        self.upper = self.ctx.args.upper
        self.words: dict[str, deque[str]] = {}
        self.counts: dict[str, tuple[int, int]] = {}

    def open(self, rid: str, params: dict[str, Any]) -> None:
        text = prompt_text(params).strip()
        if not text:
            raise InvalidRequest("the example model needs a non-empty text prompt")
        answer = text[::-1].upper() if self.upper else text[::-1]
        words = answer.split(" ")
        self.words[rid] = deque(w if i == 0 else " " + w for i, w in enumerate(words))
        self.counts[rid] = (len(words), len(words))

    def abort(self, rid: str) -> None:
        self.words.pop(rid, None)
        self.counts.pop(rid, None)

    def has_work(self) -> bool:
        return bool(self.words)

    def backlog(self) -> int:
        return len(self.words)

    def step(self) -> list[Emit]:
        emits = []
        for rid in list(self.words):
            queue = self.words[rid]
            index = self.counts[rid][0] - len(queue)
            emits.append(Emit(rid, "text", {"text": queue.popleft(), "token_ids": [index]}))
            if not queue:
                n = self.counts[rid][1]
                usage = {"prompt_tokens": n, "completion_tokens": n}
                emits.append(Emit(rid, finish=True, end_meta={"usage": usage, "finish_reason": "stop"}))
                self.abort(rid)
        return emits

    def stats(self) -> dict[str, Any]:
        return {"running": len(self.words)}


def build(model_dir: str | None = None, variant: str | None = None, **options: Any) -> tuple[Graph, ModelInfo]:
    """A checkpoint dir is optional; its config.json may set `"upper": true`."""
    args: dict[str, Any] = {}
    if model_dir:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        args["upper"] = bool(config.get("upper", False))
    graph = Graph(name="example-reverse",
                  stages=[StageSpec("reverse", "example.reverse", args=args)],
                  edges=[EdgeSpec("reverse", "text", OUT)])
    return graph, ModelInfo(id=MODEL_ID, family="example-reverse")
