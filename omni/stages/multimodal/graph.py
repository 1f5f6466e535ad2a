"""What the omni families' graphs (Qwen3-Omni's, Qwen2.5-Omni's) share: their edges and `settle_context`.

    preprocess --audio--> audio_encoder --embeds--> <lm> --text--> (client)
        |      --image--> vision_encoder --embeds--^   |
        |      --prompt-----------------------------^   +--hidden--> <speech> --codes--> <vocoder> --audio--> (client)
        +--grids (image grids, for the speech stage's positions)---------^

The family names its language-model, speech and vocoder stages (Qwen3-Omni: thinker, talker, code2wav).
"""

from __future__ import annotations

from typing import Any

from omni.kernel.graph import OUT, EdgeSpec, stage_args


def multimodal_edges(lm: str, speech: str, vocoder: str, speaks: bool) -> list[EdgeSpec]:
    """The graph's edges; the speech stage's and the vocoder's only when it speaks."""
    edges = [
        EdgeSpec("preprocess", "audio", "audio_encoder"),
        EdgeSpec("preprocess", "image", "vision_encoder"),
        EdgeSpec("preprocess", "prompt", lm),
        EdgeSpec("audio_encoder", "embeds", lm, "audio"),
        EdgeSpec("vision_encoder", "embeds", lm, "image"),
        EdgeSpec(lm, "text", OUT),
    ]
    if speaks:
        edges += [
            EdgeSpec(lm, "hidden", speech),
            EdgeSpec("preprocess", "grids", speech),
            EdgeSpec(speech, "codes", vocoder),
            EdgeSpec(vocoder, "audio", OUT),
        ]
    return edges


def settle_context(graph: Any, info: Any, lm: str) -> None:
    """What follows from the stages' final args (after config files and `--set` too): the language
    model's context bounds the prompts preprocess admits and is the model card's `max_context`."""
    context = stage_args(graph.stage(lm)).max_model_len
    graph.stage("preprocess").args["max_prompt_tokens"] = context
    info.max_context = context
