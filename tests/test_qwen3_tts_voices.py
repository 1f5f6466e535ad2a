"""Uploaded voices (`/v1/audio/voices`) on a tiny Qwen3-TTS Base served by omnid: a voice's prompt
(speaker embedding + reference codes) equals the reference's `create_voice_clone_prompt` of the
same clip; speech in a cached voice equals speech from the same clip inline; voices survive a
restart; the size bound evicts the least recently used; bad clips and unknown voices are 4xx
with OpenAI error bodies; a model that does not clone voices lists its own and refuses uploads.
"""

from __future__ import annotations

import base64
import io
import time

import numpy as np
import pytest
import requests

import qwen3_tts_reference
from omni.api.app import ServerConfig
from omni.api.voices import Prompt, VoiceStore
from omni.models.qwen3_tts.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_tts.graph import build
from test_api_support import LiveServer

REF = qwen3_tts_reference.load()
RATE = 24000
GREEDY = {"stage_sampling": {"talker": {"temperature": 0, "max_tokens": 10}}}
TRANSCRIPT = "The birch canoe slid on the smooth planks."


def _clip(seconds: float, seed: int, rate: int = RATE) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * rate)) / rate
    pcm = 0.3 * np.sin(2 * np.pi * (140 + 60 * np.sin(2.5 * t + seed)) * t) * (0.6 + 0.4 * np.sin(5 * t))
    return (pcm + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


def _wav(pcm: np.ndarray, rate: int = RATE) -> bytes:
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, pcm, rate, format="WAV", subtype="FLOAT")  # float samples: both sides read the same values
    return buf.getvalue()


def TTSServer(ckpt: str, config: ServerConfig) -> LiveServer:
    return LiveServer(mode="inline", config=config, build=lambda: build(ckpt, threads=1))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(make_tiny(tmp_path_factory.mktemp("tts-base"), kind="base", preset="tiny-a", seed=2))


@pytest.fixture(scope="module")
def voice_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("voices"))


@pytest.fixture(scope="module")
def server(ckpt, voice_dir):
    with TTSServer(ckpt, ServerConfig(port=0, voice_dir=voice_dir, voice_max_seconds=8.0)) as srv:
        yield srv


def _upload(server, name: str, pcm: np.ndarray, rate: int = RATE, text: str | None = TRANSCRIPT, **extra):
    data = {"name": name, **({"ref_text": text} if text else {}), **extra}
    return requests.post(server.url + "/v1/audio/voices", data=data,
                         files={"audio_sample": ("clip.wav", _wav(pcm, rate), "audio/wav")}, timeout=120)


def _speech(server, **body) -> requests.Response:
    body = {"model": server.info.id, "input": "Hello there, how are you?", "response_format": "pcm", **GREEDY, **body}
    return requests.post(server.url + "/v1/audio/speech", json=body, timeout=120)


def _pcm(resp: requests.Response) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    return np.frombuffer(resp.content, dtype="<i2").astype(np.float32) / 32767


def _error(resp: requests.Response, status: int, *words: str) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text)
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    for word in words:
        assert word in err["message"], err
    return err


@pytest.fixture(scope="module")
def reference(ckpt):
    if REF is None:
        pytest.skip("the Qwen3-TTS reference (qwen-tts-hf, librosa, einops) is not installed")
    return REF.Qwen3TTSModel.from_pretrained(ckpt, local_files_only=True)


@pytest.mark.parametrize("rate,text", [(RATE, TRANSCRIPT), (16000, TRANSCRIPT), (RATE, None)])
def test_a_cloned_voice_is_the_references_voice_clone_prompt(server, reference, rate, text):
    pcm = _clip(2.3, seed=rate, rate=rate)
    name = f"ref-{rate}-{'icl' if text else 'xvec'}"
    resp = _upload(server, name, pcm, rate, text)
    assert resp.status_code == 200, resp.text
    voice = resp.json()
    assert voice["object"] == "audio.voice" and voice["id"].startswith("voice_") and voice["name"] == name
    assert voice["mode"] == ("icl" if text else "x_vector")
    prompt = server.state().voices.prompt(server.state().voices.find(voice["id"]))
    want = reference.create_voice_clone_prompt(ref_audio=(pcm, rate), ref_text=text,
                                               x_vector_only_mode=text is None)[0]
    emb = want.ref_spk_embedding.float().numpy()
    np.testing.assert_allclose(prompt.spk_embedding, emb, rtol=1e-4, atol=1e-4 * float(np.abs(emb).max()))
    if text is None:
        assert prompt.ref_codes is None and want.ref_code is None
    else:
        np.testing.assert_array_equal(prompt.ref_codes, want.ref_code.numpy())
        assert prompt.ref_text == text


def test_speech_in_a_cached_voice_equals_the_same_clip_inline(server):
    pcm = _clip(1.9, seed=7)
    assert _upload(server, "same-clip", pcm).status_code == 200
    cached = _pcm(_speech(server, voice="same-clip"))
    inline = _pcm(_speech(server, voice="ignored", ref_audio=base64.b64encode(_wav(pcm)).decode(),
                          ref_text=TRANSCRIPT))
    assert len(cached) > 0 and np.abs(cached).max() > 1e-3
    np.testing.assert_array_equal(cached, inline)
    by_id = server.state().voices.find("same-clip").id
    np.testing.assert_array_equal(_pcm(_speech(server, voice={"id": by_id})), cached)  # OpenAI's {"id"} form
    xvec = _pcm(_speech(server, voice="x", ref_audio="data:audio/wav;base64," + base64.b64encode(_wav(pcm)).decode(),
                        x_vector_only_mode=True))
    assert len(xvec) > 0 and not (len(xvec) == len(cached) and np.array_equal(xvec, cached))


def test_voices_are_listed_deleted_and_survive_a_restart(ckpt, tmp_path):
    config = ServerConfig(port=0, voice_dir=str(tmp_path))
    pcm = _clip(1.5, seed=3)
    with TTSServer(ckpt, config) as first:
        created = _upload(first, "keeper", pcm).json()
        doomed = _upload(first, "doomed", _clip(1.2, seed=4)).json()
        before = _pcm(_speech(first, voice="keeper"))
        gone = requests.delete(f"{first.url}/v1/audio/voices/{doomed['id']}", timeout=30)
        assert gone.status_code == 200 and gone.json()["deleted"] is True
    with TTSServer(ckpt, config) as second:
        listed = requests.get(second.url + "/v1/audio/voices", timeout=30).json()
        assert [v["id"] for v in listed["data"]] == [created["id"]]
        assert listed["voices"] == ["keeper"]
        np.testing.assert_array_equal(_pcm(_speech(second, voice=created["id"])), before)
        assert _error(_speech(second, voice="doomed"), 400, "unknown voice")["code"] == "unknown_voice"


def test_the_size_bound_evicts_the_least_recently_used(tmp_path):
    def prompt(seed):
        rng = np.random.default_rng(seed)
        return Prompt(rng.standard_normal(256).astype(np.float32), rng.integers(0, 64, (200, 4)), "text")

    store = VoiceStore(tmp_path, max_bytes=10 ** 9)
    a = store.add("a", prompt(0), 1.0)
    one = store.total_bytes
    store = VoiceStore(tmp_path, max_bytes=int(one * 2.5))  # room for two
    b = store.add("b", prompt(1), 1.0)
    time.sleep(0.02)
    store.prompt(store.find("a"))  # "a" used after "b": "b" is the least recently used
    c = store.add("c", prompt(2), 1.0)
    assert {v.name for v in store.list()} == {"a", "c"} and store.total_bytes <= store.max_bytes
    assert store.find(b.id) is None and not (tmp_path / f"{b.id}.npz").exists()
    reopened = VoiceStore(tmp_path, max_bytes=int(one * 2.5))  # the eviction and the contents are on disk
    assert {v.id for v in reopened.list()} == {a.id, c.id}
    np.testing.assert_array_equal(reopened.prompt(reopened.find("c")).ref_codes, prompt(2).ref_codes)
    tiny = VoiceStore(tmp_path / "tiny", max_bytes=100)
    with pytest.raises(Exception, match="at most 100"):
        tiny.add("big", prompt(3), 1.0)
    assert tiny.list() == [] and not list((tmp_path / "tiny").iterdir())


def test_bad_clips_and_unknown_voices_are_4xx(server):
    _error(_upload(server, "silent", np.zeros(RATE * 2, np.float32)), 400, "silent")
    _error(_upload(server, "short", _clip(0.2, seed=1)), 400, "0.20 s")
    assert _error(_upload(server, "long", _clip(9.0, seed=1)), 413, "limit")["param"] == "audio_sample"
    bad = requests.post(server.url + "/v1/audio/voices", data={"name": "junk"},
                        files={"audio_sample": ("x.wav", b"RIFF not really a wav file", "audio/wav")}, timeout=30)
    _error(bad, 400, "decode")
    _error(_upload(server, "bad name!", _clip(1.0, seed=1)), 400, "voice name")
    assert _upload(server, "twice", _clip(1.0, seed=2)).status_code == 200
    _error(_upload(server, "TWICE", _clip(1.0, seed=2)), 409, "exists")
    no_file = requests.post(server.url + "/v1/audio/voices", data={"name": "nofile"}, timeout=30)
    _error(no_file, 400, "multipart")
    json_missing = requests.post(server.url + "/v1/audio/voices", json={"name": "j"}, timeout=30)
    _error(json_missing, 400, "audio_sample")
    as_json = requests.post(server.url + "/v1/audio/voices", timeout=60,
                            json={"name": "json-voice", "audio_sample": base64.b64encode(_wav(_clip(1.1, 5))).decode(),
                                  "ref_text": TRANSCRIPT})
    assert as_json.status_code == 200 and as_json.json()["mode"] == "icl"
    unknown = _error(_speech(server, voice="nobody"), 400, "unknown voice")  # the one code of every model
    assert unknown["param"] == "voice" and unknown["code"] == "unknown_voice" and "uploaded" in unknown["message"]
    _error(_speech(server, voice="x", ref_audio=base64.b64encode(_wav(_clip(1.0, 1))).decode()), 400, "ref_text")
    _error(_speech(server, voice="x", ref_audio="!!!", ref_text="t"), 400, "base64")
    _error(_speech(server, voice="x", ref_audio=base64.b64encode(_wav(np.zeros(RATE, np.float32))).decode(),
                   ref_text="t"), 400, "silent")
    _error(requests.delete(server.url + "/v1/audio/voices/voice_nope", timeout=30), 404, "unknown voice")


def test_a_model_that_does_not_clone_lists_its_voices_and_refuses_uploads(tmp_path):
    with LiveServer(config=ServerConfig(port=0, voice_dir=str(tmp_path))) as srv:
        listed = requests.get(srv.url + "/v1/audio/voices", timeout=30).json()
        assert listed["voices"] == srv.info.voices and all(v["type"] == "builtin" for v in listed["data"])
        resp = requests.post(srv.url + "/v1/audio/voices", data={"name": "v"},
                             files={"audio_sample": ("a.wav", _wav(_clip(1.0, 0)), "audio/wav")}, timeout=30)
        _error(resp, 400, "does not clone")
        body = {"model": srv.info.id, "input": "x", "voice": srv.info.voices[0], "ref_audio": "AAAA"}
        _error(requests.post(srv.url + "/v1/audio/speech", json=body, timeout=30), 400, "does not clone")
    assert not list(tmp_path.iterdir())  # no store for it


def test_the_voice_stage_computes_a_clip_once_and_passes_cached_prompts_on(ckpt):
    from omni.api.media import audio_part
    from omni.kernel.errors import InvalidRequest
    from omni.kernel.stage import StageContext
    from omni.models.qwen3_tts.stages.voice_stage import VoiceStage

    stage = VoiceStage(StageContext("voice", args={"model_dir": ckpt}))
    stage.setup()

    def run(rid, params):
        stage.open(rid, params)
        stage.close_input(rid)
        (emit,) = stage.step()
        return emit

    ref = {**audio_part(_clip(1.4, seed=9), RATE), "text": TRANSCRIPT}
    first, again = run("a", {"task": "speech", "voice_ref": ref}), run("b", {"task": "speech", "voice_ref": ref})
    assert first.port == "voice" and first.finish and stage.computed == 1  # the second came from the LRU
    np.testing.assert_array_equal(again.data["ref_codes"], first.data["ref_codes"])
    created = run("c", {"task": "voice", "voice_ref": {**ref, "text": None}})
    assert created.port == "voice_prompt" and created.data["ref_codes"] is None and stage.computed == 2
    cached = Prompt(first.data["spk_embedding"], first.data["ref_codes"], TRANSCRIPT).params()
    passed = run("d", {"task": "speech", "voice_prompt": cached})
    assert stage.computed == 2
    np.testing.assert_array_equal(passed.data["spk_embedding"], first.data["spk_embedding"])
    np.testing.assert_array_equal(passed.data["ref_codes"], first.data["ref_codes"])
    bad = run("e", {"task": "speech", "voice_prompt": {**cached, "num_frames": 3}})
    assert bad.error and "malformed" in bad.error and bad.error_kind == "invalid_request"
    with pytest.raises(InvalidRequest, match="needs a voice"):
        stage.open("f", {"task": "speech"})
