"""Video in for Qwen3-Omni: a tiny synthetic mp4 (made with PyAV, with an AAC audio track) through
omni equals transformers' `generate` on the same video, with and without `use_audio_in_video`;
`video_url` parts over HTTP (the `openai` client); each bound and an undecodable video refused with
its documented 4xx.

transformers' inputs come from its own `Qwen3OmniMoeProcessor` (token layout, audio-in-video
interleaving, `video_second_per_grid`) and its own `get_rope_index`. Its video processor
(`Qwen2VLVideoProcessor`) needs torchvision, which does not load beside the CPU torch here: the
processor is handed a stand-in that patchifies the frames with omni's `video_to_patches`, and
`test_frames_equal_transformers_video_processor` checks those against the real one wherever
torchvision imports (bitwise, on 2026-12-03, for five shapes, sampling rates and pixel budgets,
up- and downscaled, with torchvision 0.28's pure-torch transforms: the CUDA wheel installed with
`pip install --no-deps --target DIR` and run as `PYTHONPATH=DIR python -m pytest -k frames_equal`).
"""

from __future__ import annotations

import base64
import importlib.util
from dataclasses import replace
from unittest import mock

import requests
import numpy as np
import openai
import pytest

from omni.api.app import ServerConfig
from omni.api.media import MediaLimits, decode_audio_bytes
from omni.models.qwen3_omni.checkpoint.make_tiny import PREPROCESSOR_CONFIG
from omni.models.qwen3_omni.graph import build
from omni.layers.video_patches import FpsFrameRule, VideoPatchConfig, video_to_patches
from omni.layers.video_frames import decode
from qwen3_fixtures import IM_END, Oracle, params, summarize
from test_api_qwen3 import ckpt, oracle  # noqa: F401 (fixtures: the tiny-b checkpoint and its oracle)
from test_api_support import LiveServer
from video_fixtures import video_bytes

pytest.importorskip("transformers")

TOKENS, TALKER = 10, 30
CFG = VideoPatchConfig(min_pixels=PREPROCESSOR_CONFIG["video_min_pixels"],
                       max_pixels=PREPROCESSOR_CONFIG["video_max_pixels"], fps=PREPROCESSOR_CONFIG["video_fps"])
UPLOADS = 100_000  # the test video's body (~31 kB) fits; with its decoded track (131 kB) it does not
TIGHT = MediaLimits(max_video_bytes=16_000, max_video_pixels=64 * 48, max_video_frames=12, max_video_seconds=2.5,
                    max_audio_seconds=1.0)


@pytest.fixture(scope="module")
def video():
    return video_bytes(frames=8, fps=4, height=48, width=64, seed=1, audio_seconds=2.0)


@pytest.fixture(scope="module")
def server(ckpt):
    with LiveServer(mode="inline", build=lambda: build(ckpt),
                    extra_configs=[ServerConfig(port=0, limits=TIGHT),
                                   ServerConfig(port=0, budgets={"uploads": UPLOADS}),
                                   ServerConfig(port=0, limits=MediaLimits(image_hosts=["127.0.0.1"]))]) as srv:
        yield srv


def track(video: bytes) -> np.ndarray:
    """The video's audio track as omnid decodes it (16 kHz mono float32)."""
    return decode_audio_bytes(video, "video", MediaLimits(max_audio_bytes=1 << 30))[0]


class FramesToPatches:
    """Stands in for `Qwen2VLVideoProcessor` inside transformers' processor: omni's patches of the
    frames it is handed (the processor then does all the rest itself)."""

    temporal_patch_size, merge_size = CFG.temporal_patch_size, CFG.merge_size
    model_input_names = ["pixel_values_videos", "video_grid_thw"]

    def __call__(self, videos, **kwargs):
        import torch

        patches = [video_to_patches(np.asarray(v), CFG) for v in videos]
        return {"pixel_values_videos": torch.from_numpy(np.concatenate([p.pixels for p in patches])),
                "video_grid_thw": torch.tensor([p.grid_thw for p in patches])}


def hf_inputs(oracle: Oracle, video: bytes, text: str, use_audio: bool, fps: float = CFG.fps) -> dict:
    """transformers' processor on one video (+ its track) and a question, called with `fps`."""
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

    frames = decode(video, FpsFrameRule(replace(CFG, fps=fps))).frames
    proc = oracle.processor
    with mock.patch.object(proc, "video_processor", FramesToPatches(), create=True), \
            mock.patch.object(Qwen3OmniMoeProcessor, "check_argument_for_proper_class", lambda *a: None):
        prompt = oracle.tokenizer.apply_chat_template(
            [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}],
            tokenize=False, add_generation_prompt=True)
        audio = {"audio": [track(video)], "audio_from_video_indices": [0], "load_audio_from_video": True} \
            if use_audio else {}
        inputs = proc(text=[prompt], videos=[frames], videos_kwargs={"fps": fps}, return_tensors="pt", **audio)
    return {k: v for k, v in inputs.items() if k != "attention_mask"}


def reference(oracle: Oracle, video: bytes, text: str, use_audio: bool, fps: float = CFG.fps) -> list[int]:
    """transformers' greedy thinker tokens for one video (+ its track) and a question."""
    import torch

    inputs = hf_inputs(oracle, video, text, use_audio, fps)
    with torch.no_grad():
        out = oracle.hf.generate(**inputs, use_audio_in_video=use_audio, return_audio=False,
                                 thinker_max_new_tokens=TOKENS, thinker_eos_token_id=IM_END, thinker_do_sample=False)
    out = out.sequences if hasattr(out, "sequences") else out
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def omni_result(server, video: bytes, text: str, use_audio: bool, speech: bool = False, fps: float | None = None):
    """omni's answer through a LiveServer's or a RunningKernel's kernel."""
    part = {"type": "video", "data": video, **({"fps": fps} if fps else {})}
    if use_audio:
        pcm = track(video)
        part["audio"] = {"pcm": pcm.tobytes(), "sample_rate": 16000}
    messages = [{"role": "user", "content": [part, {"type": "text", "text": text}]}]
    p = params(messages, "ethan", TOKENS, TALKER, ("text", "audio") if speech else ("text",))

    async def run():
        return summarize(await server.kernel.submit(p).collect())

    return server.run(run()) if hasattr(server, "run") else server.loop.run(run())


@pytest.mark.parametrize("use_audio,fps", [(False, None), (True, None), (True, 4.0)],
                         ids=["frames", "audio_in_video", "fps4"])
def test_greedy_tokens_equal_transformers(server, oracle, video, use_audio, fps):
    """fps: the request's `mm_processor_kwargs.fps` (the processor called with it) for the checkpoint's 2."""
    want = reference(oracle, video, "what happens?", use_audio, fps or CFG.fps)
    assert len(want) == TOKENS and len(set(want)) > 2  # varied tokens, not a degenerate model
    assert omni_result(server, video, "what happens?", use_audio, fps=fps).tokens == want


@pytest.mark.parametrize("preset", ["tiny-a", "tiny-c"])
def test_other_shapes_equal_transformers(tmp_path, video, preset):
    """Checkpoints of other widths, depths, experts and deepstack layers, through one in-process kernel."""
    from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
    from qwen3_fixtures import LoopThread, RunningKernel

    ckpt = str(make_tiny(tmp_path / preset, seed=0, preset=preset))
    ref = Oracle(ckpt)
    loop = LoopThread()
    try:
        with RunningKernel(loop, build(ckpt, "text")[0], mode="inline") as kernel:
            for use_audio in (False, True):
                want = reference(ref, video, "what happens?", use_audio)
                assert len(set(want)) > 2
                assert omni_result(kernel, video, "what happens?", use_audio).tokens == want
    finally:
        loop.close()


def test_speech_about_a_video_equals_transformers(server, oracle, video):
    """The talker's M-RoPE over the video's grid too: the waveform within 1e-4 of its peak. (With
    use_audio_in_video transformers' talker fails, reading an `audio_config` its config lacks, as it
    does for audio and images together: there omni is only checked to speak.)"""
    import torch

    inputs = hf_inputs(oracle, video, "say it", False)
    with torch.no_grad():
        _, wav = oracle.hf.generate(**inputs, speaker="ethan", return_audio=True, thinker_max_new_tokens=TOKENS,
                                    thinker_eos_token_id=IM_END, thinker_do_sample=False,
                                    talker_max_new_tokens=TALKER, talker_do_sample=False)
    want = wav.reshape(-1).float().numpy()
    got = omni_result(server, video, "say it", False, speech=True).pcm
    peak = float(np.abs(want).max())
    assert got.shape == want.shape and peak > 1e-3 and float(np.abs(got - want).max()) <= 1e-4 * peak
    assert omni_result(server, video, "say it", True, speech=True).pcm.size > 0


@pytest.mark.parametrize("use_audio,track_seconds", [(False, 2.0), (True, 2.0), (True, 0.3)],
                         ids=["frames", "audio_in_video", "short_track"])
def test_prompt_layout_equals_transformers_processor(ckpt, oracle, use_audio, track_seconds):
    """Tokens, pixels, seconds per grid, the track's features and the M-RoPE positions (a short
    track ends its interleaved run with video tokens, a long one with audio tokens)."""
    from omni.models.qwen3_omni.stages.preprocess import Preprocessor

    video = video_bytes(frames=8, fps=4, height=48, width=64, seed=1, audio_seconds=track_seconds)

    part = {"type": "video", "data": video}
    if use_audio:
        part["audio"] = {"pcm": track(video), "sample_rate": 16000}
    got = Preprocessor(ckpt)([{"role": "user", "content": [part, {"type": "text", "text": "hi"}]}])
    want = hf_inputs(oracle, video, "hi", use_audio)
    assert got.input_ids.tolist() == want["input_ids"][0].tolist()
    assert np.array_equal(got.videos[0].pixels, want["pixel_values_videos"].numpy())
    assert list(got.videos[0].grid_thw) == want["video_grid_thw"][0].tolist()
    assert got.videos[0].second_per_grid == float(want["video_second_per_grid"][0])
    if use_audio:  # interleaved: video tokens, then audio, then video again
        ids, v, a = got.input_ids.tolist(), oracle.hf.config.thinker_config.video_token_id, \
            oracle.hf.config.thinker_config.audio_token_id
        first_audio = ids.index(a)
        assert ids.index(v) < first_audio < max(i for i, t in enumerate(ids) if t == v)
        assert np.array_equal(got.audio_features[0], want["input_features"][0].numpy())
    import torch

    from omni.models.qwen3_omni.modules.rope import RopeTokens, VisionGrid, rope_index

    th = oracle.hf.config.thinker_config
    tokens = RopeTokens(th.image_token_id, th.video_token_id, th.position_id_per_seconds,
                        th.vision_config.spatial_merge_size, audio_token_id=th.audio_token_id)
    grid = VisionGrid(*got.videos[0].grid_thw, got.videos[0].second_per_grid,
                      got.audio_token_counts[0] if use_audio else 0)
    pos, delta = rope_index(got.input_ids.tolist(), tokens, [], [grid])
    ids = want["input_ids"]
    lengths = want["feature_attention_mask"].sum(-1) if use_audio else None
    ref, ref_delta = oracle.hf.thinker.get_rope_index(ids, None, want["video_grid_thw"], torch.ones_like(ids),
                                                      use_audio, lengths, want["video_second_per_grid"])
    assert torch.equal(pos, ref[:, 0]) and delta == float(ref_delta)


def test_a_container_that_states_no_frame_count_is_counted(ckpt):
    from omni.models.qwen3_omni.stages.preprocess import Preprocessor
    from omni.layers.video_frames import probe

    mp4, mkv = (video_bytes(frames=10, fps=5, height=32, width=48, container=c) for c in ("mp4", "matroska"))
    info = probe(mkv, 100, 10**6)
    assert (info.frames, info.fps, info.seconds) == (10, 5.0, 2.0)
    pre = Preprocessor(ckpt)
    got, want = (pre([{"role": "user", "content": [{"type": "video", "data": v}]}]).videos[0] for v in (mkv, mp4))
    assert got.grid_thw == want.grid_thw and np.array_equal(got.pixels, want.pixels)


def test_video_past_the_context_is_refused_before_decoding(ckpt, video):
    from omni.kernel.errors import InvalidRequest
    from omni.models.qwen3_omni.stages.preprocess import Preprocessor

    pre = Preprocessor(ckpt)
    pre.max_video_tokens = 7  # the video makes 2 grids x 4 tokens
    with mock.patch.object(pre.frame_rule.__class__, "frame", side_effect=AssertionError("decoded")), \
            pytest.raises(InvalidRequest, match="makes 8 tokens"):
        pre([{"role": "user", "content": [{"type": "video", "data": video}]}])
    pre.max_video_tokens = 8
    assert pre([{"role": "user", "content": [{"type": "video", "data": video}]}]).videos[0].grid_thw == (2, 4, 4)


def data_url(raw: bytes, media: str = "video/mp4") -> str:
    return f"data:{media};base64," + base64.b64encode(raw).decode()


def test_video_url_over_http_equals_transformers(server, oracle, video):
    """As Qwen's own examples call vLLM: `mm_processor_kwargs` with fps and do_sample_frames too."""
    want = oracle.tokenizer.decode(reference(oracle, video, "and the sound?", True, 4.0), skip_special_tokens=True)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    resp = client.chat.completions.create(
        model=server.info.id, temperature=0, max_tokens=TOKENS,
        messages=[{"role": "user", "content": [{"type": "video_url", "video_url": {"url": data_url(video)}},
                                               {"type": "text", "text": "and the sound?"}]}],
        extra_body={"mm_processor_kwargs": {"use_audio_in_video": True, "fps": 4, "do_sample_frames": True}})
    assert resp.choices[0].message.content == want and resp.usage.completion_tokens == TOKENS


def post(url: str, part: dict, **extra) -> requests.Response:
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [part]}], **extra}
    return requests.post(url + "/v1/chat/completions", json=body, timeout=60)


def video_part(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


REFUSALS = {  # name: (video, extra body, status, code, words in the message)
    "bytes": (dict(frames=8, fps=4, height=48, width=64, seed=9, audio_seconds=2.4), {}, 413, "too_large", "bytes"),
    "pixels": (dict(frames=4, fps=4, height=64, width=64), {}, 413, "too_large", "pixels"),
    "frames": (dict(frames=14, fps=10, height=16, width=16), {}, 413, "too_large", "frames"),
    "seconds": (dict(frames=6, fps=2, height=16, width=16), {}, 413, "too_large", "lasts"),
    "audio seconds": (dict(frames=4, fps=2, height=16, width=16, audio_seconds=1.2),
                      {"mm_processor_kwargs": {"use_audio_in_video": True}}, 413, "too_large", "audio"),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_each_bound_refused(server, name):
    shape, extra, status, code, words = REFUSALS[name]
    resp = post(server.servers[1].url, video_part(data_url(video_bytes(**shape))), **{"model": server.info.id, **extra})
    error = resp.json()["error"]
    assert resp.status_code == status and error["code"] == code and words in error["message"], error
    assert error["param"] == "messages[0].content[0].video_url.url"


@pytest.fixture(scope="module")
def video_host(tmp_path_factory, video):
    """A plain HTTP server on the loopback serving the test video as /v.mp4 (an allow-listed host)."""
    import functools
    import http.server
    import threading

    root = tmp_path_factory.mktemp("videos")
    (root / "v.mp4").write_bytes(video)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    thread.join(10)


def test_video_from_an_allow_listed_host(server, video, video_host):
    url = server.servers[3].url
    fetched = post(url, video_part(video_host + "/v.mp4"), model=server.info.id, max_tokens=TOKENS, temperature=0)
    inline = post(url, video_part(data_url(video)), model=server.info.id, max_tokens=TOKENS, temperature=0)
    assert fetched.status_code == 200 and fetched.json()["choices"] == inline.json()["choices"]
    missing = post(url, video_part(video_host + "/nothing.mp4"), model=server.info.id)
    assert missing.status_code == 400 and missing.json()["error"]["code"] == "video_fetch_failed"
    refused = post(server.url, video_part(video_host + "/v.mp4"), model=server.info.id)  # not allow-listed there
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "video_url_not_allowed"


def test_decoded_track_is_held_on_the_uploads_budget(server, video):
    url = server.servers[2].url
    resp = post(url, video_part(data_url(video)), model=server.info.id,
                mm_processor_kwargs={"use_audio_in_video": True})
    assert resp.status_code == 429 and resp.json()["error"]["code"] == "memory_budget_exceeded", resp.text
    assert post(url, video_part(data_url(video)), model=server.info.id).status_code == 200


BAD = {  # name: (url, extra body, code)
    "undecodable": (data_url(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8), {}, "invalid_video"),
    "no video stream": (None, {}, "invalid_video"),
    "not a video data url": (data_url(b"x", "image/png"), {}, "invalid_video"),
    "file path": ("file:///etc/passwd", {}, "video_url_not_allowed"),
    "remote host": ("http://example.com/a.mp4", {}, "video_url_not_allowed"),
    "unknown mm kwarg": ("", {"mm_processor_kwargs": {"num_frames": 4}}, "unknown_parameter"),
    "every frame": ("", {"mm_processor_kwargs": {"do_sample_frames": False}}, "unsupported_value"),
    "fps out of range": ("", {"mm_processor_kwargs": {"fps": 0}}, "invalid_value"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_video_is_a_400(server, video, name):
    url, extra, code = BAD[name]
    if url is None:  # an audio-only file
        import io

        import soundfile as sf

        buf = io.BytesIO()
        sf.write(buf, np.zeros(1600, np.float32), 16000, format="WAV")
        url = data_url(buf.getvalue(), "video/mp4")
    resp = post(server.url, video_part(url or data_url(video)), **{"model": server.info.id, **extra})
    error = resp.json()["error"]
    assert resp.status_code == 400 and error["code"] == code, error


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="torchvision is not installed")
def test_frames_equal_transformers_video_processor():
    import io
    import sys
    import types

    import av

    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    from transformers.video_utils import VideoMetadata

    for frames, fps, h, w, lo, hi, rate in [(8, 4, 48, 64, 32 * 32, 128 * 128, 2.0), (25, 10, 70, 90, 1024, 4096, 2.0),
                                            (30, 30, 36, 36, 1024, 16384, 7.0), (6, 3, 120, 160, 1024, 4096, 2.0),
                                            (9, 3, 40, 200, 128 * 32 * 32, 768 * 32 * 32, 2.0)]:
        raw = video_bytes(frames=frames, fps=fps, height=h, width=w, seed=3)
        cfg = VideoPatchConfig(min_pixels=lo, max_pixels=hi, fps=rate)
        ours = video_to_patches(decode(raw, FpsFrameRule(cfg)).frames, cfg)
        with av.open(io.BytesIO(raw)) as c:  # every frame, as transformers' PyAV reader sees the file
            every = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
            st = c.streams.video[0]
            meta = VideoMetadata(total_num_frames=int(st.frames), fps=float(st.average_rate), height=h, width=w,
                                 duration=st.frames / float(st.average_rate))
        vp = Qwen2VLVideoProcessor(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3,
                                   image_std=[0.5] * 3, size={"shortest_edge": lo, "longest_edge": hi})
        ref = vp(videos=[every], video_metadata=[meta], fps=rate, do_sample_frames=True, cap_pixels_per_frame=False,
                 return_tensors="pt")
        assert list(ours.grid_thw) == ref["video_grid_thw"][0].tolist()
        assert np.array_equal(ours.pixels, ref["pixel_values_videos"].numpy())
