"""A turn's audio is encoded while it is spoken: the encode task sends the complete attention
windows of the clip so far, and the clip's own request at commit finds them in the audio encoder's
cache (same features bitwise, so the same content hash) and encodes only the last window. The rows
equal the whole clip's within the encoders' batching tolerance (1e-5 of their scale), and the whole
clip's equal transformers' for a request holding it alone."""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
import openai
import pytest
import torch

from omni.kernel.stage import StageContext
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.modules.audio_encoder import AudioEncoder, AudioFeaturesEncoder
from omni.models.qwen3_omni.stages.preprocess import Preprocessor
from omni.models.qwen3_omni.stages.preprocess_stage import PreprocessStage
from omni.stages.encoder import content_hash
from test_api_qwen3 import QwenServer
from test_realtime_audio_reuse import counters

SECONDS = 9.5  # the tiny model's attention window is 4 s: two windows before the end, the tail at commit


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.set_num_threads(1)
    return str(make_tiny(tmp_path_factory.mktemp("tiny-streamed"), seed=1))


def speech_like(seconds: float, seed: int = 0, peak_at: float = 0.5) -> np.ndarray:
    """Noise with a pause of digital silence at 1 s and its loudest moment at `peak_at` s (the
    log-mels' floor, where the silence sits, hangs on the clip's peak)."""
    rng = np.random.default_rng(seed)
    pcm = (rng.standard_normal(int(seconds * 16000)) * 0.05).astype(np.float32)
    pcm[16000:24000] = 0
    at = int(peak_at * 16000)
    pcm[at:at + 1600] *= 10
    return pcm


def stage(ckpt) -> PreprocessStage:
    pre = PreprocessStage(StageContext(name="pre", args={"model_dir": ckpt}))
    pre.pre = Preprocessor(ckpt)
    return pre


def spoken(pre: PreprocessStage, pcm: np.ndarray, until: float) -> list[dict]:
    """The encode task's windows for the first `until` seconds of `pcm`."""
    messages = [{"role": "user", "content": [{"type": "audio", "audio": pcm[:int(until * 16000)]}]}]
    emits = pre.encode_windows("r", messages)
    assert emits[-1].port == "prompt" and len(emits[-1].data["token_ids"]) == 0 and emits[-1].finish
    return [e.data for e in emits if e.port == "audio"]


def whole(pre: PreprocessStage, pcm: np.ndarray) -> list[dict]:
    emits = pre.process("r", [{"role": "user", "content": [{"type": "audio", "audio": pcm}]}])
    return [e.data for e in emits if e.port == "audio"]


def test_streamed_windows_are_the_whole_clips_and_its_rows_equal_transformers(ckpt):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    pre, pcm = stage(ckpt), speech_like(SECONDS)
    assert spoken(pre, pcm, 3.9) == []  # no window is complete yet
    streamed = spoken(pre, pcm, 8.5)
    final = whole(pre, pcm)
    assert len(streamed) == 2 and len(final) == 3
    assert [content_hash(w) for w in streamed] == [content_hash(w) for w in final[:2]]  # the cache serves them

    encoder = AudioFeaturesEncoder(AudioEncoder.from_checkpoint(ckpt))
    rows_streamed = torch.cat([encoder.encode([w])[0]["audio_embeds"] for w in streamed]
                              + [encoder.encode([final[2]])[0]["audio_embeds"]])
    rows_whole = torch.cat([o["audio_embeds"] for o in encoder.encode(final)])  # one forward, as at commit
    scale = max(1.0, rows_whole.abs().max().item())
    assert rows_streamed.shape == rows_whole.shape
    assert (rows_streamed - rows_whole).abs().max().item() <= 1e-5 * scale

    thinker = Qwen3OmniMoeForConditionalGeneration.from_pretrained(ckpt).thinker.eval()
    fx = pre.pre.feature_extractor(
        [pcm], sampling_rate=16000, padding=True, return_attention_mask=True, return_tensors="pt")
    with torch.no_grad():
        ref = thinker.get_audio_features(fx["input_features"], feature_attention_mask=fx["attention_mask"])
    assert (rows_whole - ref.last_hidden_state).abs().max().item() <= 1e-5 * scale


def test_a_window_whose_log_mels_change_later_is_not_reused(ckpt):
    pre, pcm = stage(ckpt), speech_like(SECONDS, peak_at=9.0)  # the peak comes after the windows
    streamed = spoken(pre, pcm, 8.5)
    final = whole(pre, pcm)
    assert len(streamed) == 2
    assert content_hash(streamed[0]) != content_hash(final[0])  # the window with the silence


def test_bad_encode_requests_fail_clearly(ckpt):
    from omni.kernel.errors import InvalidRequest
    from omni.models.qwen3_omni.request import chat_messages

    with pytest.raises(InvalidRequest, match="encode task needs 'audio'"):
        chat_messages({"task": "encode"})


@pytest.fixture(scope="module")
def server(ckpt):
    with QwenServer(ckpt) as srv:
        yield srv


def test_commit_sends_windows_encoded_while_the_turn_was_spoken(server):
    pcm = speech_like(SECONDS, seed=3)
    pcm24 = np.interp(np.arange(int(len(pcm) * 1.5)) / 1.5, np.arange(len(pcm)), pcm)
    data = (np.clip(pcm24, -1, 1) * 32767).astype("<i2").tobytes()
    client = openai.AsyncOpenAI(api_key="unused", base_url=server.url + "/v1", max_retries=0,
                                websocket_base_url=server.url.replace("http://", "ws://") + "/v1")
    audio_stats = lambda: next(s for n, s in server.run(server.kernel.stats()).items()  # noqa: E731
                               if n.startswith("audio_encoder"))
    marks = {}

    async def go():
        async with client.beta.realtime.connect(model=server.info.id) as conn:
            assert (await conn.recv()).type == "session.created"
            await conn.session.update(session={"modalities": ["text"], "turn_detection": None,
                                               "stage_sampling": {"thinker": {"max_tokens": 8, "temperature": 0}}})
            async for event in conn:
                if event.type == "session.updated":
                    break
            marks["start"] = audio_stats()
            for i in range(0, len(data), 4800):
                await conn.input_audio_buffer.append(audio=base64.b64encode(data[i:i + 4800]).decode())
            deadline = time.monotonic() + 60
            while audio_stats()["encoded"] - marks["start"]["encoded"] < 2:  # the two windows, before commit
                assert time.monotonic() < deadline, audio_stats()
                await asyncio.sleep(0.05)
            marks["spoken"] = audio_stats()
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            async for event in conn:
                assert event.type != "error", event.error
                if event.type == "response.done":
                    assert event.response.status in ("completed", "incomplete")
                    break
            marks["done"] = audio_stats()

    asyncio.run(asyncio.wait_for(go(), 120))
    spoken_, done = marks["spoken"], marks["done"]
    assert spoken_["encoded"] - marks["start"]["encoded"] == 2
    assert done["encoded"] - spoken_["encoded"] == 1  # only the last window at commit
    assert done["cache_hits"] - spoken_["cache_hits"] >= 2
