"""/v1/realtime driven by the official `openai` client's realtime interfaces (beta and GA) against
omnid serving a tiny Qwen3-Omni (stages as processes): a spoken turn found by server VAD and
answered with audio, a barge-in that cancels and truncates, response.cancel, malformed events, a
dropped socket, 8 sessions at once. Random weights: the asserts are on protocol and lifecycle.
Plus a model that does not hear (the demo marked so): its audio turns are transcribed first."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import time

import aiohttp
import numpy as np
import openai
import pytest
import soundfile as sf

from omni.api.media import resample
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from test_api_qwen3 import QwenServer
from test_api_support import LiveServer

pytest.importorskip("websockets")
pytest.importorskip("silero_vad")

SHORT = {"thinker": {"max_tokens": 6}, "talker": {"max_tokens": 24}}
# long enough (thousands of frames) that no answer can end before a barge-in is heard, however loaded the machine
LONG = {"thinker": {"max_tokens": 2500, "ignore_eos": True}, "talker": {"max_tokens": 3500, "ignore_eos": True}}
VAD = {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 400, "prefix_padding_ms": 200}
SEMANTIC = {"type": "semantic_vad", "eagerness": "high"}
CHUNK = 4800  # bytes of pcm16 per append: 100 ms at 24 kHz


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ckpt = str(make_tiny(tmp_path_factory.mktemp("tiny-rt"), seed=1))
    with QwenServer(ckpt) as srv:
        yield srv


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> bytes:
    """espeak-ng saying a sentence, as 24 kHz pcm16 with silence before and after."""
    path = tmp_path_factory.mktemp("speech") / "hello.wav"
    try:
        subprocess.run(["espeak-ng", "-w", str(path), "Hello there, could you tell me a short story?"], check=True,
                       capture_output=True, timeout=30)
    except (FileNotFoundError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"espeak-ng is needed: {exc}")
    pcm, rate = sf.read(str(path), dtype="float32")
    pcm = resample(pcm, rate, 24000)
    pcm = np.concatenate([np.zeros(7200, np.float32), pcm, np.zeros(24000, np.float32)])
    return (np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()


def run(coro, timeout: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def connect(server, beta: bool = True):
    ws = server.url.replace("http://", "ws://") + "/v1"
    client = openai.AsyncOpenAI(api_key="unused", base_url=server.url + "/v1", websocket_base_url=ws, max_retries=0)
    return (client.beta.realtime if beta else client.realtime).connect(model=server.info.id)


async def until(conn, kind: str, log: list | None = None):
    """Events up to and including the first of type `kind` (every one's type goes into `log`)."""
    async for event in conn:
        if log is not None:
            log.append(event)
        if event.type == kind:
            return event
        assert event.type != "error", event.error


async def setup(conn, **session) -> None:
    created = await conn.recv()
    assert created.type == "session.created"
    await conn.session.update(session={"stage_sampling": SHORT, **session})
    await until(conn, "session.updated")


async def speak(conn, pcm: bytes) -> None:
    for i in range(0, len(pcm), CHUNK):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i:i + CHUNK]).decode())


async def say(conn, text: str) -> None:
    await conn.conversation.item.create(item={"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": text}]})


def stages_idle(server) -> bool:
    stats = server.run(server.kernel.stats())
    return stats["kernel"]["in_flight"] == 0 and all(
        s.get("running", 0) == 0 and s.get("in_flight", 0) == 0 for name, s in stats.items() if name != "kernel")


def aborted(server) -> dict[str, int]:
    return {name: s.get("aborted", 0) for name, s in server.run(server.kernel.stats()).items() if name != "kernel"}


def wait_idle(server, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not stages_idle(server):
        assert time.monotonic() < deadline, server.run(server.kernel.stats())
        time.sleep(0.05)


def types(events) -> list[str]:
    return [e.type for e in events]


def test_spoken_turn_detected_and_answered_with_audio_then_a_text_turn(server, speech):
    async def go():
        async with connect(server) as conn:
            await setup(conn, turn_detection=VAD, voice="ethan")
            await speak(conn, speech)
            log: list = []
            done = await until(conn, "response.done", log)
            names = types(log)
            order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                     "input_audio_buffer.committed", "conversation.item.created", "response.created",
                     "response.output_item.added", "response.audio.delta", "response.audio.done",
                     "response.audio_transcript.done", "response.output_item.done"]
            assert [names.index(n) for n in order] == sorted(names.index(n) for n in order), names
            started, stopped, committed = (next(e for e in log if e.type == t) for t in order[:3])
            assert started.item_id == stopped.item_id == committed.item_id
            assert 0 <= started.audio_start_ms < stopped.audio_end_ms
            user = next(e.item for e in log if e.type == "conversation.item.created")
            assert user.role == "user" and user.content[0].type == "input_audio"
            audio = b"".join(base64.b64decode(e.delta) for e in log if e.type == "response.audio.delta")
            assert len(audio) > 0 and len(audio) % 2 == 0
            transcript = "".join(e.delta for e in log if e.type == "response.audio_transcript.delta")
            assert next(e for e in log if e.type == "response.audio_transcript.done").transcript == transcript
            assert done.response.status in ("completed", "incomplete") and done.response.usage.output_tokens > 0
            answer = done.response.output[0]
            assert answer.role == "assistant" and answer.content[0].type == "audio"
            first_prompt = done.response.usage.input_tokens
            # a typed turn: the whole conversation (audio turn, answer, this) is the prompt
            await say(conn, "and then?")
            await conn.response.create(response={"modalities": ["text"]})
            log = []
            done = await until(conn, "response.done", log)
            assert "response.text.delta" in types(log) and "response.audio.delta" not in types(log)
            assert done.response.usage.input_tokens > first_prompt
            await conn.send({"type": "conversation.item.retrieve", "item_id": user.id})
            assert (await until(conn, "conversation.item.retrieved")).item.id == user.id

    run(go())
    wait_idle(server)


@pytest.mark.parametrize("detect", [VAD, SEMANTIC], ids=["server_vad", "semantic_vad"])
def test_barge_in_cancels_the_answer_in_every_stage_and_truncates_it(server, speech, detect):
    async def go():
        async with connect(server) as conn:
            await setup(conn, turn_detection=detect)
            await say(conn, "tell me everything")
            await conn.response.create(response={"stage_sampling": LONG})
            first = await until(conn, "response.audio.delta")
            assert server.run(server.kernel.stats())["kernel"]["in_flight"] == 1
            before = aborted(server)
            await speak(conn, speech)  # the user talks over the answer
            log: list = []
            cancelled = await until(conn, "response.done", log)
            assert "input_audio_buffer.speech_started" in types(log)
            assert cancelled.response.status == "cancelled"
            assert cancelled.response.status_details.reason == "turn_detected"
            assert server.run(server.kernel.stats())["kernel"]["in_flight"] <= 1  # at most the next answer
            deadline = time.monotonic() + 5  # each stage counts the cancel as it reaches it
            while not all((after := aborted(server))[name] > before[name] for name in
                          ("thinker.0", "talker.0", "code2wav.0")):
                assert time.monotonic() < deadline, (before, after)
                await asyncio.sleep(0.05)
            sent = [first, *(e for e in log if e.type == "response.audio.delta")]
            heard_ms = sum(len(base64.b64decode(e.delta)) for e in sent) // 48 // 2  # half of it was played
            await conn.conversation.item.truncate(item_id=first.item_id, content_index=0, audio_end_ms=heard_ms)
            truncated = await until(conn, "conversation.item.truncated", log)
            assert truncated.item_id == first.item_id and truncated.audio_end_ms == heard_ms
            # the turn that interrupted is committed and answered (short: the session's sampling)
            done = await until(conn, "response.done", log)
            assert "input_audio_buffer.committed" in types(log) and done.response.status != "cancelled"
            await conn.send({"type": "conversation.item.retrieve", "item_id": first.item_id})
            heard = (await until(conn, "conversation.item.retrieved")).item
            assert heard.content[0].transcript == ""  # what the user never heard is gone from the context

    run(go())
    wait_idle(server)


def test_response_cancel_then_the_session_goes_on(server, speech):
    async def go():
        async with connect(server) as conn:
            await setup(conn, turn_detection=None)
            await say(conn, "talk for a long time")
            await conn.response.create(response={"stage_sampling": LONG})
            await until(conn, "response.audio.delta")
            await conn.response.cancel()
            done = await until(conn, "response.done")
            assert done.response.status == "cancelled" and done.response.status_details.reason == "client_cancelled"
            await conn.response.cancel()
            error = await conn.recv()
            assert error.type == "error" and error.error.code == "response_cancel_not_active"
            # an audio item made by the client (not the buffer), then an answer over it
            await conn.input_audio_buffer.append(audio=base64.b64encode(speech[:9600]).decode())
            await conn.input_audio_buffer.clear()
            await until(conn, "input_audio_buffer.cleared")
            await conn.input_audio_buffer.commit()
            assert (await conn.recv()).error.code == "input_audio_buffer_commit_empty"
            clip = base64.b64encode(speech[:48000]).decode()
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_audio", "audio": clip}, {"type": "input_text", "text": "what was that?"}]})
            item = (await until(conn, "conversation.item.created")).item
            assert [c.type for c in item.content] == ["input_audio", "input_text"]
            await conn.response.create()
            assert (await until(conn, "response.done")).response.status in ("completed", "incomplete")

    run(go())
    wait_idle(server)


def test_malformed_events_get_errors_and_the_session_stays_usable(server):
    bad = [
        "not json", "[1, 2]", '{"type": "no.such.event", "event_id": "e1"}',
        '{"type": "input_audio_buffer.append", "audio": "@@@"}',
        '{"type": "input_audio_buffer.commit"}',
        '{"type": "session.update", "session": {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}}',
        '{"type": "session.update", "session": {"voice": "nobody"}}',
        '{"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}}',
        '{"type": "conversation.item.create", "item": {"type": "message", "role": "robot", "content": []}}',
        '{"type": "conversation.item.truncate", "item_id": "item_missing", "audio_end_ms": 5}',
        '{"type": "response.create", "response": {"stage_sampling": {"no_stage": {"max_tokens": 2}}}}',
        '{"type": "response.cancel"}',
    ]

    async def go():
        url = server.url.replace("http://", "ws://") + "/v1/realtime?model=" + server.info.id
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(server.url.replace("http://", "ws://") + "/v1/realtime?model=nope")
            assert refused.value.status == 404
            async with http.ws_connect(url, headers={"OpenAI-Beta": "realtime=v1"}) as ws:
                assert (await ws.receive_json())["type"] == "session.created"
                for raw in bad:
                    await ws.send_str(raw)
                    event = await ws.receive_json(timeout=10)
                    assert event["type"] == "error", (raw, event)
                    assert event["error"]["message"] and event["error"]["type"] == "invalid_request_error"
                    if '"e1"' in raw:
                        assert event["error"]["event_id"] == "e1"
                await ws.send_bytes(b"\xff\xfe")
                assert (await ws.receive_json(timeout=10))["type"] == "error"
                await ws.send_json({"type": "session.update", "session": {"turn_detection": None,
                                                                          "stage_sampling": SHORT}})
                assert (await ws.receive_json(timeout=10))["type"] == "session.updated"
                await ws.send_json({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": "still there?"}]}})
                await ws.send_json({"type": "response.create"})
                while (event := await ws.receive_json(timeout=30))["type"] != "response.done":
                    assert event["type"] != "error", event
                assert event["response"]["status"] in ("completed", "incomplete")
                # a conversation longer than the model's context: that response fails, nothing else
                too_long = "word " * (server.info.max_context * 4)
                await ws.send_json({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": too_long}]}})
                await ws.send_json({"type": "response.create"})
                while (event := await ws.receive_json(timeout=30))["type"] != "error":
                    pass
                assert event["error"]["code"] == "context_length_exceeded"
                while (event := await ws.receive_json(timeout=30))["type"] != "response.done":
                    pass
                assert event["response"]["status"] == "failed" and event["response"]["output"] == []

    run(go())


def test_bad_turn_detection_and_g711_are_refused_naming_the_field_and_what_is_served(server):
    refused = [  # (session, param, words of the message)
        ({"turn_detection": {"type": "vad"}}, "session.turn_detection.type", ("vad", "server_vad", "semantic_vad")),
        ({"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}, "session.turn_detection.eagerness",
         ("eager", "low", "medium", "high", "auto")),
        ({"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "sometimes"}}}},
         "session.audio.input.turn_detection.eagerness", ("sometimes", "auto")),
        ({"input_audio_format": "g711_ulaw"}, "session.input_audio_format", ("g711_ulaw", "pcm16")),
        ({"output_audio_format": "g711_alaw"}, "session.output_audio_format", ("g711_alaw", "pcm16")),
        ({"audio": {"input": {"format": {"type": "audio/pcmu"}}}}, "session.audio.input.format",
         ("audio/pcmu", "audio/pcm")),
        ({"audio": {"output": {"format": {"type": "audio/pcma"}}}}, "session.audio.output.format",
         ("audio/pcma", "audio/pcm")),
    ]

    async def go():
        url = server.url.replace("http://", "ws://") + "/v1/realtime?model=" + server.info.id
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(url) as ws:
                created = await ws.receive_json()
                assert created["type"] == "session.created"
                for session, param, words in refused:
                    await ws.send_json({"type": "session.update", "event_id": "ev_bad", "session": session})
                    event = await ws.receive_json(timeout=10)
                    assert event["type"] == "error", (session, event)
                    error = event["error"]
                    assert error["param"] == param and error["event_id"] == "ev_bad", error
                    assert all(w in error["message"] for w in words), error["message"]
                # nothing changed: the session still detects turns with server_vad and speaks pcm16
                await ws.send_json({"type": "session.update", "session": {"instructions": "brief"}})
                updated = (await ws.receive_json(timeout=10))["session"]
                assert updated["audio"] == created["session"]["audio"]
                assert updated["audio"]["input"]["turn_detection"]["type"] == "server_vad"
                assert updated["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
                # semantic_vad is served, in OpenAI's shape
                await ws.send_json({"type": "session.update", "session": {"audio": {"input": {
                    "turn_detection": {"type": "semantic_vad", "eagerness": "low"}}}}})
                updated = (await ws.receive_json(timeout=10))["session"]
                assert updated["audio"]["input"]["turn_detection"] == {
                    "type": "semantic_vad", "eagerness": "low", "create_response": True, "interrupt_response": True}

    run(go())


def test_dropped_socket_frees_every_stage(server):
    async def go():
        url = server.url.replace("http://", "ws://") + "/v1/realtime?model=" + server.info.id
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(url)
            await ws.receive_json()
            await ws.send_json({"type": "session.update", "session": {"turn_detection": None}})
            await ws.send_json({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on and on"}]}})
            await ws.send_json({"type": "response.create", "response": {"stage_sampling": LONG}})
            while (await ws.receive_json(timeout=30))["type"] != "response.output_audio.delta":
                pass
            ws._response.connection.transport.abort()  # gone, without a close handshake

    run(go())
    wait_idle(server)


def test_eight_concurrent_sessions_and_the_ga_dialect(server):
    async def one(i: int) -> tuple[str, list[str]]:
        async with connect(server, beta=bool(i % 2)) as conn:
            await setup(conn, turn_detection=None, **({"output_modalities": ["text"]} if i % 2 == 0
                                                      else {"modalities": ["text"]}))
            await say(conn, f"session {i} says hi")
            await conn.response.create()
            log: list = []
            done = await until(conn, "response.done", log)
            return done.response.status, types(log)

    async def go():
        return await asyncio.gather(*(one(i) for i in range(8)))

    results = run(go(), timeout=90)
    for i, (status, names) in enumerate(results):
        assert status in ("completed", "incomplete")
        if i % 2:  # beta names
            assert "conversation.item.created" in names and "response.text.done" in names
        else:  # GA names
            assert "conversation.item.added" in names and "response.output_text.done" in names
            assert not any(n.startswith("response.text.") for n in names)
    wait_idle(server)


# ---- a model that does not hear: Whisper (here the demo, marked as transcribing) first -----------

@pytest.fixture(scope="module")
def deaf_server():
    with LiveServer(mode="inline", info_changes={"transcribes": True, "audio_input": False}) as srv:
        yield srv


def test_audio_turn_of_a_model_without_audio_input_is_transcribed_first(deaf_server, speech):
    async def go():
        async with connect(deaf_server) as conn:
            await setup(conn, turn_detection=None, stage_sampling={"generator": {"max_tokens": 4}},
                        input_audio_transcription={"model": "whisper-1", "prompt": "words"})
            await speak(conn, speech)
            await conn.input_audio_buffer.commit()
            committed = await until(conn, "input_audio_buffer.committed")
            await conn.response.create()
            log: list = []
            await until(conn, "response.done", log)
            names = types(log)
            done = names.index("conversation.item.input_audio_transcription.completed")
            assert done < names.index("response.output_item.added")
            event = log[done]
            assert event.item_id == committed.item_id and event.transcript

    run(go())


def test_shutdown_closes_open_sessions_going_away():
    srv = LiveServer(mode="inline", stage_args={"generator": {"step_delay_s": 0.02}}).__enter__()
    closed: dict = {}

    async def go():
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(srv.url.replace("http://", "ws://") + "/v1/realtime") as ws:
                await ws.receive_json()
                await ws.send_json({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": "long"}]}})
                await ws.send_json({"type": "response.create",
                                    "response": {"stage_sampling": {"generator": {"max_tokens": 4000}}}})
                while (await ws.receive_json(timeout=10))["type"] != "response.output_audio.delta":
                    pass
                started = time.monotonic()
                stopping = asyncio.get_running_loop().run_in_executor(None, srv.__exit__, None, None, None)
                async for _ in ws:
                    pass
                closed.update(code=ws.close_code, after=time.monotonic() - started)
                await stopping

    try:
        run(go(), timeout=30)
    finally:
        if srv.thread.is_alive():
            srv.__exit__(None, None, None)
    assert closed["code"] == 1001 and closed["after"] < 5


# ---- the playground, in headless Chromium with a fake microphone -----------------------------------

def test_playground_is_served_as_static_files(deaf_server):
    import requests

    page = requests.get(deaf_server.url + "/", timeout=10)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "omni playground" in page.text
    for name in ("app.js", "capture-worklet.js", "style.css"):
        assert requests.get(f"{deaf_server.url}/static/{name}", timeout=10).status_code == 200, name
    assert requests.get(deaf_server.url + "/static/../pyproject.toml", timeout=10).status_code in (403, 404)


CHROMIUM = "/usr/bin/chromium"


def test_playground_speaks_and_hears_in_headless_chromium(server, speech, tmp_path):
    import os

    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is needed (apt-get install -y chromium)")
    wav = tmp_path / "mic.wav"
    pcm = np.frombuffer(speech, dtype="<i2")
    sf.write(str(wav), np.concatenate([pcm, np.zeros(48000, np.int16)]), 24000, subtype="PCM_16")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--use-fake-ui-for-media-stream",
             "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={wav}",
             "--autoplay-policy=no-user-gesture-required"]
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=flags)
        try:
            page = browser.new_page()
            page.goto(server.url + "/")
            page.wait_for_selector(f"#model option[value='{server.info.id}']", state="attached", timeout=15000)
            page.click("#connect")
            page.wait_for_selector("#status[data-state='connected']", timeout=15000)
            page.click("#mic")
            page.wait_for_function(
                "() => +document.getElementById('audio-bytes').textContent > 0 && "
                "[...document.querySelectorAll('.turn.assistant')].some(t => t.dataset.ttfaMs && "
                "t.querySelector('.text').textContent.length > 0) && "
                "document.querySelector('.turn.user') !== null", timeout=45000)
            page.screenshot(path=str(tmp_path / "playground.png"), full_page=True)
            ttfa = page.eval_on_selector(".turn.assistant[data-ttfa-ms]", "el => +el.dataset.ttfaMs")
            assert ttfa >= 0 and "first audio after" in page.inner_text(".turn.assistant .ttfa")
            assert (tmp_path / "playground.png").stat().st_size > 0
        finally:
            browser.close()
    wait_idle(server, timeout=20)


# ---- units: the voice detector, session settings in both shapes, the browser's key ---------------

def test_speech_detector_finds_one_turn_in_speech_and_none_in_silence(speech):
    from omni.api.realtime.audio_buffer import InputAudio
    from omni.api.realtime.vad import SpeechDetector, VadSettings

    pcm24 = np.frombuffer(speech, dtype="<i2").astype(np.float32) / 32768
    pcm = InputAudio.resample_whole(pcm24)
    detector = SpeechDetector(VadSettings(0.5, prefix_padding_ms=200, silence_duration_ms=400))
    try:
        changes = [c for i in range(0, len(pcm), 1600) for c in detector.feed(pcm[i:i + 1600])]
        assert [c.kind for c in changes] == ["started", "stopped"]
        onset_ms, end_ms = changes[0].sample / 16, changes[1].sample / 16
        assert 0 <= onset_ms <= 300 and end_ms > onset_ms + 1000  # 300 ms of silence lead in; seconds of speech
        assert end_ms < len(pcm) / 16 - 400
        assert detector.feed(np.zeros(32000, np.float32)) == []
    finally:
        detector.close()


def test_session_settings_parse_beta_and_ga_shapes(deaf_server):
    from omni.api.errors import ApiError
    from omni.api.realtime.config import SessionConfig

    state = deaf_server.state()
    base = SessionConfig.default(state, "omni-demo")
    beta = base.updated(state, {"modalities": ["text"], "instructions": "hi", "input_audio_format": "pcm16",
                                "turn_detection": {"type": "server_vad", "threshold": 0.7, "silence_duration_ms": 300},
                                "max_response_output_tokens": 9})
    assert beta.modalities == ["text"] and beta.turn_detection.vad.threshold == 0.7
    assert beta.turn_detection.vad.silence_duration_ms == 300 and beta.max_output_tokens == 9
    ga = base.updated(state, {"type": "realtime", "output_modalities": ["audio"], "audio": {
        "input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None},
        "output": {"voice": "TONE"}}, "max_output_tokens": "inf"})
    assert ga.modalities == ["text", "audio"] and ga.turn_detection is None and ga.voice == "tone"
    rendered = ga.render(beta=False, session_id="s")
    assert rendered["output_modalities"] == ["audio"] and rendered["audio"]["input"]["turn_detection"] is None
    assert beta.render(beta=True, session_id="s")["modalities"] == ["text"]
    for bad in ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}, {"tools": [{"type": "x"}]},
                {"turn_detection": {"threshold": 2}}, {"modalities": []}, {"max_output_tokens": 0}, []):
        with pytest.raises(ApiError):
            base.updated(state, bad)


def test_browsers_send_the_api_key_as_a_subprotocol():
    from omni.api.app import ServerConfig

    with LiveServer(mode="inline", config=ServerConfig(port=0, api_key="sekret")) as srv:
        async def go():
            url = srv.url.replace("http://", "ws://") + "/v1/realtime"
            async with aiohttp.ClientSession() as http:
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await http.ws_connect(url)
                assert refused.value.status == 401
                async with http.ws_connect(url, protocols=["realtime", "openai-insecure-api-key.sekret"]) as ws:
                    assert ws.protocol == "realtime" and (await ws.receive_json())["type"] == "session.created"
                async with http.ws_connect(url, headers={"Authorization": "Bearer sekret"}) as ws:
                    assert (await ws.receive_json())["type"] == "session.created"

        run(go())
