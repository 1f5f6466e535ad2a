"""The demo family's graph builder: the toy pipeline of stages.py and what the API
should know of it."""

from __future__ import annotations

from typing import Any

from omni.kernel.graph import Graph
from omni.models.registry import ModelInfo
from omni.models.demo.stages import DEFAULT_MAX_TOKENS, MAX_CONTEXT, SAMPLE_RATE, demo_graph


def build_demo(model_dir: str | None = None, variant: str | None = None, **options: Any) -> tuple[Graph, ModelInfo]:
    info = ModelInfo(id="omni-demo", family="demo", speaks=True, voices=["tone"], sample_rate=SAMPLE_RATE,
                     random_weights=True, max_context=MAX_CONTEXT, sampling_stage="generator",
                     completions=True, audio_input=True, default_max_tokens=DEFAULT_MAX_TOKENS)
    return demo_graph(), info
