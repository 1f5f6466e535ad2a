"""Video in for Qwen2.5-Omni: tiny synthetic mp4s (made with PyAV, one with an AAC track, one silent)
through omni's graph equal transformers' `Qwen2_5OmniForConditionalGeneration` on the same video, with
and without `use_audio_in_video`, on both tiny presets: the prompt's token layout (the track interleaved
in 2 s chunks), pixels and M-RoPE positions; greedy thinker tokens; the talker's greedy codes; a
`video_url` part over HTTP (the `openai` client); each bound (pixels, frames, seconds, the context) and an
undecodable video refused with its 4xx.

transformers' inputs come from its own `Qwen2_5OmniProcessor` (token layout, chunked interleaving,
`video_second_per_grid`) and its own `get_rope_index`. Its video processor (`Qwen2VLVideoProcessor`)
needs torchvision, which does not load beside the CPU torch here: the processor is handed a stand-in
that patchifies the frames with omni's `video_to_patches` (tests/test_qwen3_video.py checks those
patches against the real video processor wherever torchvision imports). transformers' `generate` hands
every input it does not know to the talker too, and its talker refuses `pixel_values_videos`: the
reference gets them as `thinker_pixel_values_videos`, which reach the thinker only. Weights are random:
what the model says about a video is noise, the same noise in both.
"""

from __future__ import annotations

import base64
from dataclasses import replace
from unittest import mock

import numpy as np
import openai
import pytest
import requests

from omni.api.app import ServerConfig
from omni.api.media import MediaLimits, decode_audio_bytes
from omni.layers.mrope_index import VisionGrid, rope_index
from omni.layers.video_frames import decode
from omni.layers.video_patches import FpsFrameRule, video_to_patches
from omni.models.qwen2_5_omni.graph import build
from omni.models.qwen2_5_omni.stages.preprocess_stage import preprocessor
from qwen2_5_fixtures import Oracle25, served_tiny
from qwen3_fixtures import IM_END, params, summarize
from test_api_qwen2_5 import ckpt, server  # noqa: F401 (fixtures: a served tiny-a checkpoint)
from test_api_support import LiveServer
from video_fixtures import video_bytes

pytest.importorskip("transformers")

THINKER, TALKER = 12, 30
CLIPS = {  # name: video_bytes arguments
    "sound": dict(frames=12, fps=4, height=48, width=64, seed=1, audio_seconds=3.0),  # 3 grids, 2 chunks
    "long": dict(frames=16, fps=4, height=48, width=64, seed=4, audio_seconds=4.0),
    "silent": dict(frames=10, fps=5, height=40, width=72, seed=2),  # no audio track
}


@pytest.fixture(scope="module")
def clips():
    return {name: video_bytes(**kw) for name, kw in CLIPS.items()}


@pytest.fixture(scope="module", params=["tiny-a", "tiny-b"])
def served(request, loop, tmp_path_factory):
    with served_tiny(request.param, loop, tmp_path_factory) as (path, _, kernel):
        yield Oracle25(path), preprocessor(path), kernel, path


def track(video: bytes) -> np.ndarray:
    """The video's audio track as omnid decodes it (16 kHz mono float32)."""
    return decode_audio_bytes(video, "video", MediaLimits(max_audio_bytes=1 << 30))[0]


class FramesToPatches:
    """Stands in for `Qwen2VLVideoProcessor` inside transformers' processor: omni's patches of the
    frames it is handed (the processor does all the rest itself)."""

    model_input_names = ["pixel_values_videos", "video_grid_thw"]

    def __init__(self, cfg) -> None:
        self.cfg, self.temporal_patch_size, self.merge_size = cfg, cfg.temporal_patch_size, cfg.merge_size

    def __call__(self, videos, **kwargs):
        import torch

        patches = [video_to_patches(np.asarray(v), self.cfg) for v in videos]
        return {"pixel_values_videos": torch.from_numpy(np.concatenate([p.pixels for p in patches])),
                "video_grid_thw": torch.tensor([p.grid_thw for p in patches])}


def hf_inputs(oracle: Oracle25, pre, video: bytes, text: str, use_audio: bool, fps: float = 2.0) -> dict:
    """transformers' processor on one video (+ its track) and a question, called with `fps`."""
    import torch
    from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import Qwen2_5OmniProcessor

    cfg = replace(pre.video_cfg, fps=fps)
    frames = decode(video, FpsFrameRule(cfg)).frames
    proc = oracle.processor
    with mock.patch.object(proc, "video_processor", FramesToPatches(cfg), create=True), \
            mock.patch.object(Qwen2_5OmniProcessor, "check_argument_for_proper_class", lambda *a: None):
        prompt = oracle.tokenizer.apply_chat_template(
            [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}],
            tokenize=False, add_generation_prompt=True)
        audio = {"audio": [track(video)], "audio_from_video_indices": [0], "load_audio_from_video": True} \
            if use_audio else {}
        out = dict(proc(text=[prompt], videos=[frames], videos_kwargs={"fps": fps}, return_tensors="pt", **audio))
    out["video_second_per_grid"] = torch.as_tensor(out["video_second_per_grid"])
    out["attention_mask"] = torch.ones_like(out["input_ids"])
    return out


def reference(oracle: Oracle25, inputs: dict, use_audio: bool, speak: bool = False):
    """transformers' greedy thinker tokens (and with `speak`, the talker's greedy codes)."""
    import torch

    n = inputs["input_ids"].shape[1]
    with torch.no_grad():
        if not speak:
            out = oracle.hf.thinker.generate(**inputs, use_audio_in_video=use_audio, max_new_tokens=THINKER,
                                             do_sample=False, eos_token_id=IM_END)
            return out[0, n:].tolist(), None
        tk = oracle.hf.config.talker_config
        kwargs = {k: v for k, v in inputs.items() if k != "pixel_values_videos"}
        oracle.codes.clear()
        seqs, _ = oracle.hf.generate(**kwargs, thinker_pixel_values_videos=inputs["pixel_values_videos"],
                                     use_audio_in_video=use_audio, speaker="Chelsie", thinker_max_new_tokens=THINKER,
                                     thinker_eos_token_id=IM_END, thinker_do_sample=False,
                                     talker_max_new_tokens=TALKER, talker_do_sample=False,
                                     talker_repetition_penalty=1.0,
                                     talker_eos_token_id=[tk.tts_codec_pad_token_id, tk.tts_codec_end_token_id])
    return seqs[0, n:].tolist(), oracle.codes[0][0].numpy()


def video_part(video: bytes, use_audio: bool, fps: float | None = None, pcm_bytes: bool = True) -> dict:
    part = {"type": "video", "data": video, **({"fps": fps} if fps else {})}
    if use_audio:
        pcm = track(video)
        part["audio"] = {"pcm": pcm.tobytes() if pcm_bytes else pcm, "sample_rate": 16000}
    return part


def ask(kernel, video: bytes, text: str, use_audio: bool, fps: float | None = None, speak: bool = False):
    messages = [{"role": "user", "content": [video_part(video, use_audio, fps), {"type": "text", "text": text}]}]
    p = params(messages, "chelsie" if speak else None, THINKER, TALKER, ("text", "audio") if speak else ("text",))
    p["sampling"]["talker"]["repetition_penalty"] = 1.0
    return kernel.loop.run(_collect(kernel, p))


async def _collect(kernel, p):
    return summarize(await kernel.kernel.submit(p).collect())


LAYOUTS = [("sound", True, 2.0), ("sound", False, 2.0), ("sound", True, 1.0), ("long", True, 0.5),
           ("silent", False, 2.0)]


@pytest.mark.parametrize("clip,use_audio,fps", LAYOUTS, ids=[f"{c}-{'av' if a else 'v'}-{f}" for c, a, f in LAYOUTS])
def test_prompt_layout_and_positions_equal_transformers(served, clips, clip, use_audio, fps):
    """Tokens, pixels, grid, seconds per grid, the track's features and the M-RoPE positions (fps 1: one
    grid a chunk; fps 0.5: grids 100 positions apart, past two chunk boundaries at once, which the
    reference counts as one)."""
    import torch

    oracle, pre, _, path = served
    got = pre([{"role": "user", "content": [video_part(clips[clip], use_audio, fps, pcm_bytes=False),
                                            {"type": "text", "text": "hi"}]}])
    want = hf_inputs(oracle, pre, clips[clip], "hi", use_audio, fps)
    ids = got.input_ids.tolist()
    assert ids == want["input_ids"][0].tolist()
    assert np.array_equal(got.videos[0].pixels, want["pixel_values_videos"].numpy())
    assert list(got.videos[0].grid_thw) == want["video_grid_thw"][0].tolist()
    assert got.videos[0].second_per_grid == float(want["video_second_per_grid"][0])
    th = oracle.hf.config.thinker_config
    if use_audio:
        frames = int(want["feature_attention_mask"][0].sum())  # the processor pads the clip to 30 s
        assert np.array_equal(got.audio_features[0], want["input_features"][0, :, :frames].numpy())
        runs = np.flatnonzero(np.diff([t == th.video_token_index for t in ids if t in (th.video_token_index,
                                                                                        th.audio_token_index)]))
        assert len(runs) >= 2  # video, audio, video...: chunks interleaved
    grid = VisionGrid(*got.videos[0].grid_thw, got.videos[0].second_per_grid,
                      got.audio_token_counts[0] if use_audio else 0)
    pos, delta = rope_index(ids, rope_tokens(path), [], [grid])
    lengths = want["feature_attention_mask"].sum(-1) if use_audio else None
    ref, ref_delta = oracle.hf.thinker.get_rope_index(want["input_ids"], None, want["video_grid_thw"],
                                                      want["attention_mask"], use_audio, lengths,
                                                      want["video_second_per_grid"])
    assert torch.equal(pos, ref[:, 0].float()) and delta == float(ref_delta)


def rope_tokens(path: str):
    """omni's thinker's M-RoPE numbers for a checkpoint (as its thinker builds them; no weights)."""
    import torch

    from omni.models.qwen2_5_omni.config import load_omni_config
    from omni.models.qwen2_5_omni.modules.thinker import Qwen2_5OmniThinker

    with torch.device("meta"):
        return Qwen2_5OmniThinker(load_omni_config(path).thinker).rope_tokens


GREEDY = [("sound", False, None), ("sound", True, None), ("silent", False, None), ("sound", True, 1.0)]


@pytest.mark.parametrize("clip,use_audio,fps", GREEDY, ids=[f"{c}-{'av' if a else 'v'}-{f or 2}" for c, a, f in GREEDY])
def test_greedy_tokens_equal_transformers(served, clips, clip, use_audio, fps):
    """fps: the request's `mm_processor_kwargs.fps` (the processor called with it) for the checkpoint's 2."""
    oracle, pre, kernel, _ = served
    want, _ = reference(oracle, hf_inputs(oracle, pre, clips[clip], "what happens?", use_audio, fps or 2.0), use_audio)
    assert len(want) == THINKER and len(set(want)) > 2  # varied tokens, not a degenerate model
    assert ask(kernel, clips[clip], "what happens?", use_audio, fps).tokens == want


@pytest.mark.parametrize("use_audio", [False, True], ids=["frames", "audio_in_video"])
def test_talker_codes_equal_transformers(served, clips, use_audio):
    """The talker after a video: its rows zero the video (and audio) placeholders' embeddings, its
    positions stay 1-D, as transformers' `generate` runs it."""
    oracle, pre, kernel, _ = served
    tokens, codes = reference(oracle, hf_inputs(oracle, pre, clips["sound"], "say it", use_audio), use_audio, speak=True)
    got = ask(kernel, clips["sound"], "say it", use_audio, speak=True)
    assert got.tokens == tokens and len(set(codes.tolist())) > 2
    assert got.codes is not None and got.codes.reshape(-1).tolist() == codes.tolist() and got.pcm.size > 0


def test_video_past_the_context_is_refused_before_decoding(served, clips):
    from omni.kernel.errors import InvalidRequest

    _, pre, _, _ = served
    pre.max_video_tokens = 11  # the silent clip makes 2 grids x 6 tokens
    try:
        with mock.patch.object(FpsFrameRule, "frame", side_effect=AssertionError("decoded")), \
                pytest.raises(InvalidRequest, match="makes 12 tokens"):
            pre([{"role": "user", "content": [{"type": "video", "data": clips["silent"]}]}])
        pre.max_video_tokens = 12
        assert pre([{"role": "user", "content": [{"type": "video", "data": clips["silent"]}]}]).videos[0].grid_thw \
            == (2, 4, 6)
    finally:
        pre.max_video_tokens = 0


def data_url(raw: bytes, media: str = "video/mp4") -> str:
    return f"data:{media};base64," + base64.b64encode(raw).decode()


def test_video_url_over_http_equals_transformers(server, ckpt, clips):  # noqa: F811
    """As Qwen's own examples call vLLM: `mm_processor_kwargs` with use_audio_in_video and fps."""
    oracle, pre = Oracle25(ckpt), preprocessor(ckpt)
    tokens, _ = reference(oracle, hf_inputs(oracle, pre, clips["sound"], "and the sound?", True, 1.0), True)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    resp = client.chat.completions.create(
        model=server.info.id, temperature=0, max_tokens=THINKER, modalities=["text"],
        messages=[{"role": "user", "content": [{"type": "video_url", "video_url": {"url": data_url(clips["sound"])}},
                                               {"type": "text", "text": "and the sound?"}]}],
        extra_body={"mm_processor_kwargs": {"use_audio_in_video": True, "fps": 1, "do_sample_frames": True}})
    assert resp.choices[0].message.content == oracle.tokenizer.decode(tokens, skip_special_tokens=True)
    assert resp.usage.completion_tokens == len(tokens)


BAD = {  # name: (a video_bytes shape or a url, status, code); the bounds: a server with tight `MediaLimits`
    "pixels": (dict(frames=4, fps=4, height=64, width=64), 413, "too_large"),
    "frames": (dict(frames=14, fps=10, height=16, width=16), 413, "too_large"),
    "seconds": (dict(frames=6, fps=2, height=16, width=16), 413, "too_large"),
    "undecodable": (data_url(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8), 400, "invalid_video"),
    "not a video data url": (data_url(b"x", "image/png"), 400, "invalid_video"),
    "file path": ("file:///etc/passwd", 400, "video_url_not_allowed"),
}
TIGHT = MediaLimits(max_video_pixels=64 * 48, max_video_frames=12, max_video_seconds=2.5)


@pytest.fixture(scope="module")
def tight(ckpt):  # noqa: F811
    with LiveServer(mode="inline", build=lambda: build(ckpt, "text"), config=ServerConfig(port=0, limits=TIGHT)) as srv:
        yield srv


def post(server, url: str) -> requests.Response:
    body = {"model": server.info.id, "max_tokens": 2, "modalities": ["text"],
            "messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}}]}]}
    return requests.post(server.url + "/v1/chat/completions", json=body, timeout=60)


@pytest.mark.parametrize("name", list(BAD))
def test_bad_video_is_a_4xx(tight, clips, name):
    video, status, code = BAD[name]
    resp = post(tight, data_url(video_bytes(**video)) if isinstance(video, dict) else video)
    error = resp.json()["error"]
    assert resp.status_code == status and error["code"] == code, error
    assert error["param"] == "messages[0].content[0].video_url.url"
    assert post(tight, data_url(clips["silent"])).status_code == 200  # within every bound
