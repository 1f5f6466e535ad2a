"""Issue 27 point 3: a stage receives only the parts of a request it uses. Media bytes reach the
entry (preprocess / an encoder) and the stages whose spec says `media=True`; every other stage's
RequestOpen comes without them. Which params keys hold media is each family graph's declaration
(`Graph.media`), which stages read them each stage spec's (`StageSpec.media`): the kernel names no key.

Checked on every family omni registers, built from a tiny checkpoint (its tiny writer), against
the media its requests can carry by its ModelInfo: a talker, code2wav, codec or vocoder never sees
the clip or image bytes.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from omni.kernel import messages as m
from omni.kernel.actor import Actor
from omni.models.registry import REGISTRY, ModelInfo, resolve

# The stages of each family that read a request's media (the entry first).
READERS = {
    "demo": {"encoder"},
    "qwen3-omni": {"preprocess"},
    "qwen3-tts": {"preprocess", "voice"},
    "whisper": {"encoder"},
}
NEVER = ("talker", "code2wav", "codec", "vocoder", "thinker", "generator", "decoder")  # stage names


def request_media(info: ModelInfo) -> set[str]:
    """The params keys that hold bytes of an upload in this model's requests (as omni/api builds them)."""
    keys = set()
    if "chat" in info.tasks:
        keys.add("messages")  # input_audio / image_url parts
    if info.audio_input or info.transcribes:
        keys.add("audio")  # a Realtime turn's or a transcription's clip
    if info.clones_voices:
        keys |= {"voice_ref", "voice_prompt"}  # an uploaded clip, a stored voice
    return keys


def tiny_model(family: str, root: Path) -> str | None:
    """A model dir of `family` (None: the family builds without one)."""
    if family == "demo":
        return None
    out = root / family
    if family == "qwen3-tts":
        from omni.models.qwen3_tts.checkpoint.make_tiny import make_tiny

        return str(make_tiny(out, kind="base"))  # the kind that clones: it has the voice stage
    if family == "whisper":
        from test_whisper_support import tiny_random_checkpoint

        return str(tiny_random_checkpoint(out))
    if family in REGISTRY.tiny_writers:
        resolve(REGISTRY.tiny_writers[family])([str(out)])
        return str(out)
    pytest.skip(f"no tiny checkpoint of {family!r} to build its graph from")


def opens(graph, params: dict) -> dict[str, set[str]]:
    """Stage -> the params keys its RequestOpen holds, as the actor that opens it forwards it."""
    msg = m.RequestOpen("r", params)
    forward = SimpleNamespace(graph=graph)
    return {s.name: set(Actor._open_for(forward, s.name, msg).params) for s in graph.stages}


@pytest.mark.parametrize("family", sorted(READERS))
def test_media_reach_only_the_stages_that_read_them(family, tmp_path):
    entry = REGISTRY.family_for(name=family)
    graph, info = resolve(entry.target)(tiny_model(family, tmp_path), None)
    media = request_media(info)
    assert media <= set(graph.media), f"{family}: its requests carry {sorted(media)}, its graph declares " \
                                      f"{sorted(graph.media)}"
    got = opens(graph, {**{key: b"\0" * 64 for key in media}, "task": "x", "modalities": ["text", "audio"]})
    readers = {name for name, keys in got.items() if keys & media}
    assert readers == READERS[family]
    assert all(keys == {"task", "modalities"} for name, keys in got.items() if name not in readers)
    assert not readers & set(NEVER)

