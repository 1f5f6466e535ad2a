"""What the omni families' graphs (Qwen3-Omni's, Qwen2.5-Omni's) share: their edges and `settle`.

    preprocess --audio--> audio_encoder --embeds--> thinker --text--> (client)
        |      --image--> vision_encoder --embeds--^   |
        |      --prompt-----------------------------^   +--hidden--> talker --codes--> <vocoder> --audio--> (client)
        +--grids (image grids, for the talker's positions)---------------^
"""

from __future__ import annotations

from typing import Any

from omni.kernel.graph import OUT, EdgeSpec, stage_args


def omni_edges(vocoder: str, speaks: bool) -> list[EdgeSpec]:
    """The graph's edges; the talker's and the vocoder's only when it speaks."""
    edges = [
        EdgeSpec("preprocess", "audio", "audio_encoder"),
        EdgeSpec("preprocess", "image", "vision_encoder"),
        EdgeSpec("preprocess", "prompt", "thinker"),
        EdgeSpec("audio_encoder", "embeds", "thinker", "audio"),
        EdgeSpec("vision_encoder", "embeds", "thinker", "image"),
        EdgeSpec("thinker", "text", OUT),
    ]
    if speaks:
        edges += [
            EdgeSpec("thinker", "hidden", "talker"),
            EdgeSpec("preprocess", "grids", "talker"),
            EdgeSpec("talker", "codes", vocoder),
            EdgeSpec(vocoder, "audio", OUT),
        ]
    return edges


def settle(graph: Any, info: Any) -> None:
    """What follows from the stages' final args (after config files and `--set` too): the thinker's
    context bounds the prompts preprocess admits and is the model card's `max_context`."""
    context = stage_args(graph.stage("thinker")).max_model_len
    graph.stage("preprocess").args["max_prompt_tokens"] = context
    info.max_context = context
