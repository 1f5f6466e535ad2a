"""The typed args the omni families' stages share (torch-free: the kernel checks graphs against them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omni.stages.args import StageArgs


@dataclass
class PreprocessArgs(StageArgs):
    """omni_preprocess_stage.py: chat template, tokenizer, media features."""

    model_dir: str = ""  # the checkpoint directory (tokenizer, processor config)
    voices: list[str] = field(default_factory=list)  # the talker's speakers; empty: the graph makes no audio
    max_batch: int = 8  # requests prepared per step
    max_prompt_tokens: int = 0  # the thinker's context: longer prompts are refused up front; 0 = unbounded
