"""Qwen3-Omni end to end through the kernel (one process per stage) against transformers' `generate`.

For three tiny random checkpoints that differ in layers, widths, experts, code groups and codebook
sizes, and for text-only, audio-input, image-input, two-audio and two-image prompts: greedy thinker
tokens and talker codes (every code group) exactly equal transformers', and the streamed waveform
(the audio events concatenated) equals transformers' waveform within 1e-4 of its peak.
transformers' inputs come from its own processor, so omni's preprocessing is under test too. One
kernel per checkpoint serves every test of that checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pytest

from omni.kernel.errors import InvalidRequest, RequestCancelled
from omni.models.registry import ModelInfo
from omni.models.qwen3_omni.graph import build
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.request import SPEECH_INSTRUCTION
from qwen3_fixtures import IM_END, Oracle, Reference, Result, RunningKernel, expose_codes, params, prompts

pytest.importorskip("transformers")

PRESETS = ["tiny-a", "tiny-b", "tiny-c"]
KINDS = ["text", "audio", "image", "audios", "images"]
THINKER, TALKER = 12, 40  # talker frames stay under transformers' 300-frame decode chunk
WAVE_TOL = 1e-4  # of the reference waveform's peak


@dataclass
class System:
    preset: str
    ckpt: str
    info: ModelInfo
    oracle: Oracle
    kernel: RunningKernel
    refs: dict[str, Reference]
    results: dict[str, Result]


@pytest.fixture(scope="module", params=PRESETS)
def system(request, loop, tmp_path_factory):
    ckpt = str(make_tiny(tmp_path_factory.mktemp(request.param), seed=0, preset=request.param))
    oracle = Oracle(ckpt)
    refs = {kind: oracle.generate(m, "ethan", THINKER, TALKER) for kind, m in prompts().items()}
    graph, info = build(ckpt)
    with RunningKernel(loop, expose_codes(graph)) as kernel:
        results = {kind: kernel.one(params(m, "ethan", THINKER, TALKER)) for kind, m in prompts().items()}
        yield System(request.param, ckpt, info, oracle, kernel, refs, results)


def assert_same_audio(got: Result, ref: Reference) -> None:
    assert got.codes is not None and got.codes.shape == ref.codes.shape, (got.codes, ref.codes.shape)
    assert (got.codes == ref.codes).all()
    assert got.pcm.shape == ref.wav.shape
    peak = float(np.abs(ref.wav).max())
    assert peak > 1e-3  # audible scale: a silent waveform would make the comparison empty
    assert float(np.abs(got.pcm - ref.wav).max()) <= WAVE_TOL * peak


@pytest.mark.parametrize("kind", KINDS)
def test_thinker_tokens_equal_transformers(system, kind):
    got, ref = system.results[kind], system.refs[kind]
    assert got.tokens == ref.tokens and len(set(ref.tokens)) > 1
    assert got.text == ref.text  # the streamed text deltas add up to the decoded tokens
    assert got.final["finish_reason"] == "length"
    prompt_len = len(system.oracle.inputs(prompts()[kind])["input_ids"][0])
    assert got.final["usage"] == {"prompt_tokens": prompt_len, "completion_tokens": len(ref.tokens)}


@pytest.mark.parametrize("kind", KINDS)
def test_talker_codes_and_streamed_waveform_equal_transformers(system, kind):
    got, ref = system.results[kind], system.refs[kind]
    assert_same_audio(got, ref)
    if len(ref.codes) > 4:  # more frames than the vocoder's first chunk: the audio came in pieces
        assert got.audio_events > 1


def test_references_end_every_way(system):
    """Across the prompts of a checkpoint the talker stops at its max_tokens and (tiny-c) at its EOS."""
    frames = {kind: len(ref.codes) for kind, ref in system.refs.items()}
    if system.preset == "tiny-c":
        assert min(frames.values()) < TALKER - 1  # codec EOS
    else:
        assert set(frames.values()) == {TALKER - 1}  # max_tokens: the last token never gets a frame


def test_eight_concurrent_requests_equal_each_alone(system):
    voices = ["ethan", "chelsie", "aiden"]
    batch = [params(prompts()[KINDS[i % 5]], voices[i % 3], THINKER + 2 * (i // 5), TALKER - 5 * (i // 5))
             for i in range(8)]
    kernel = system.kernel
    alone = [kernel.one(p) for p in batch]
    before = kernel.stats()
    together = kernel.many(batch)
    after = kernel.stats()
    for a, t in zip(alone, together):
        assert a.tokens == t.tokens and a.text == t.text
        assert a.codes.shape == t.codes.shape and (a.codes == t.codes).all()
        np.testing.assert_allclose(t.pcm, a.pcm, rtol=0, atol=WAVE_TOL * max(float(np.abs(a.pcm).max()), 1e-3))
    assert alone[0].tokens == system.refs["text"].tokens  # same request as the reference
    assert_same_audio(together[0], system.refs["text"])
    for stage in ("thinker.0", "talker.0"):  # the requests shared steps
        steps = after[stage]["num_steps"] - before[stage]["num_steps"]
        generated = after[stage]["num_generated_tokens"] - before[stage]["num_generated_tokens"]
        assert steps < generated, stage


def test_text_only_request_skips_talker_and_vocoder(system):
    before = system.kernel.stats()
    got = system.kernel.one(params(prompts()["image"], modalities=("text",)))
    after = system.kernel.stats()
    assert got.tokens == system.refs["image"].tokens and got.pcm.size == 0 and got.codes is None
    assert after["talker.0"]["num_steps"] == before["talker.0"]["num_steps"]
    assert after["code2wav.0"]["forwards"] == before["code2wav.0"]["forwards"]


def test_text_variant_gives_the_same_text(system, loop):
    graph, info = build(system.ckpt, "text")
    assert [s.name for s in graph.stages] == ["preprocess", "audio_encoder", "vision_encoder", "thinker"]
    assert not info.speaks and info.voices == [] and system.info.speaks
    with RunningKernel(loop, graph) as kernel:
        for kind, messages in prompts().items():
            got = kernel.one(params(messages, voice=None, modalities=("text",)))
            assert (got.tokens, got.text) == (system.results[kind].tokens, system.results[kind].text), kind
            assert got.pcm.size == 0
        with pytest.raises(InvalidRequest, match="does not produce audio"):
            kernel.one(params(prompts()["text"]))


def test_cancel_mid_stream_frees_kv_blocks_in_both_ar_stages(system):
    kernel = system.kernel
    # seconds of work are left when the first audio arrives
    long = params(prompts()["image"], thinker_tokens=500, talker_tokens=280, ignore_eos=True)

    async def cancel_after_first_audio():
        stream = kernel.kernel.submit(long)
        async for event in stream:
            if event.port == "audio":
                break
        held = await kernel.kernel.stats()
        await stream.cancel()
        with pytest.raises(RequestCancelled):
            async for _ in stream:
                pass
        return held

    held = kernel.loop.run(cancel_after_first_audio())
    for stage in ("thinker.0", "talker.0"):
        assert held[stage]["running"] == 1 and held[stage]["free_blocks"] < held[stage]["total_blocks"], stage
    deadline = time.monotonic() + 10
    while True:
        stats = kernel.stats()
        if all(stats[s]["free_blocks"] == stats[s]["total_blocks"] and stats[s]["in_flight"] == 0
               for s in ("thinker.0", "talker.0")):
            break
        assert time.monotonic() < deadline, {s: stats[s] for s in ("thinker.0", "talker.0")}
        time.sleep(0.05)
    again = kernel.one(params(prompts()["text"], "ethan", THINKER, TALKER))  # the stages serve on
    assert again.tokens == system.refs["text"].tokens and (again.codes == system.refs["text"].codes).all()


def test_speech_task_says_the_input(system):
    """/v1/audio/speech's params: the thinker is asked to read `input` aloud; transformers agrees."""
    p = {"task": "speech", "input": "the quick brown fox", "voice": "aiden", "modalities": ["audio"], "messages": [],
         "sampling": {"thinker": {"temperature": 0, "max_tokens": THINKER}, "talker": {"temperature": 0,
                                                                                      "max_tokens": TALKER}}}
    got = system.kernel.one(p)
    ref = system.oracle.generate([{"role": "user", "content": SPEECH_INSTRUCTION + p["input"]}], "aiden", THINKER,
                                 TALKER)
    assert got.tokens == ref.tokens
    assert_same_audio(got, ref)


def test_bad_requests_fail_with_typed_errors(system):
    good = params(prompts()["text"])
    cases = {
        "voice": ({**good, "voice": "nobody"}, "ethan"),
        "task": ({**good, "task": "dance"}, "unknown task"),
        "messages": ({**good, "messages": []}, "non-empty"),
        "content": ({**good, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}, "unsupported"),
        "video": ({**good, "messages": [{"role": "user", "content": [{"type": "video"}]}]}, "video part without"),
        "bad video": ({**good, "messages": [{"role": "user", "content": [{"type": "video", "data": b"nope"}]}]},
                      "cannot decode video"),
        "image": ({**good, "messages": [{"role": "user", "content": [{"type": "image", "data": b"nope"}]}]},
                  "image"),
        "sampling": ({**good, "sampling": {"thinker": {"temperature": -1}}}, "temperature"),
    }
    for name, (p, words) in cases.items():
        with pytest.raises(InvalidRequest, match=words):
            system.kernel.one(p)
    assert system.kernel.one(good).tokens == system.results["text"].tokens


def test_text_stream_never_emits_half_a_character():
    """Byte-level tokens split UTF-8 characters: the stream holds them back until they are whole."""
    from omni.layers.tokenizer_offline import build_tokenizer
    from omni.stages.ar.detokenizer import TextStream

    tok = build_tokenizer()
    text = "né 😀!"
    ids = tok.encode(text, add_special_tokens=False) + [IM_END]
    stream = TextStream(tok.backend_tokenizer)
    deltas = [stream.push([t]) for t in ids]
    assert "".join(deltas) + stream.flush() == text
    assert all("\ufffd" not in d for d in deltas) and deltas[1] == "" and deltas[2] == "é"
    cut = TextStream(tok.backend_tokenizer)
    assert cut.push(ids[:6]) == ""  # the chunk ends inside the emoji: held back whole
    flushed = cut.flush()  # the request ended there: what was held, the broken emoji as replacement marks
    assert flushed.startswith("né ") and set(flushed[3:]) == {"\ufffd"}


def test_stage_processes_share_the_cores(tmp_path):
    """Each stage process pins torch's threads: unpinned, six stages on two cores ran ~20x slower."""
    import os

    import torch

    from omni.stages.threads import pin_torch_threads

    ckpt = make_tiny(tmp_path / "t", preset="tiny-a")
    graph, _ = build(ckpt)
    assert {s.args["threads"] for s in graph.stages} == {max(1, (os.cpu_count() or 1) // 6)}
    graph, _ = build(ckpt, threads=3, stage_args={"thinker": {"threads": 5}})
    assert {s.name: s.args["threads"] for s in graph.stages}["thinker"] == 5
    assert {s.args["threads"] for s in graph.stages if s.name != "thinker"} == {3}
    before = torch.get_num_threads()
    try:
        pin_torch_threads(2)
        assert torch.get_num_threads() == 2
        pin_torch_threads(0)  # no setting: left alone
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
