"""Names and small inputs (issue 25, point 6): one name rule with no trailing newline or control
characters (voice names, Realtime item ids), odd pcm16 byte counts refused (unit and over a
Realtime socket), no object reprs in image errors, the voice cache trimmed at start-up."""

from __future__ import annotations

import base64

import pytest

from omni.api.errors import ApiError
from omni.api.media import MediaLimits, _check_image
from omni.api.realtime.conversation import pcm16_to_float
from omni.api.voices import check_name


@pytest.mark.parametrize("name", ["abc\n", "abc\r", "a\tb", "abc\x00", "\nabc", ""])
def test_a_voice_name_with_a_control_character_is_refused(name):
    with pytest.raises(ApiError) as err:
        check_name(name)
    assert err.value.status == 400


def test_a_plain_voice_name_is_taken():
    check_name("alice-2.v1")


CONTROL = [chr(c) for c in (*range(32), 127)]


def test_the_name_rule_refuses_every_control_character_anywhere():
    from omni.api.names import is_name

    for c in CONTROL:
        assert not any(is_name(n) for n in (f"abc{c}", f"{c}abc", f"a{c}c")), repr(c)
    assert not is_name("a" * 65) and is_name("a" * 64) and not is_name("a b") and not is_name(None)


@pytest.mark.parametrize("bad", ["abc\n", "item 1", "a\x00", "", "-x", "x" * 65, 7])
def test_a_realtime_item_id_follows_the_name_rule(bad):
    from omni.api.realtime.conversation import item_from_event

    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}], "id": bad}
    if bad == "":  # no id: the server makes one
        assert item_from_event(item, None).id.startswith("item_")
        return
    with pytest.raises(ApiError) as err:
        item_from_event(item, None)
    assert err.value.status == 400 and err.value.param == "item.id" and err.value.code == "invalid_value"


def test_a_clients_own_item_id_is_kept():
    from omni.api.realtime.conversation import item_from_event

    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}],
            "id": "msg_001.a-B"}
    assert item_from_event(item, None).id == "msg_001.a-B"


def test_an_odd_pcm16_byte_count_is_refused():
    with pytest.raises(ApiError) as err:
        pcm16_to_float(b"\x00\x01\x02")
    assert err.value.status == 400 and "3 bytes" in str(err.value)
    assert len(pcm16_to_float(b"\x00\x01\x02\x03")) == 2


def test_a_realtime_socket_refuses_odd_pcm16_and_a_bad_item_id_and_keeps_nothing():
    import asyncio

    import aiohttp

    from omni.api.state import ServerConfig
    from test_api_support import LiveServer

    odd = base64.b64encode(b"\x00\x01" * 100 + b"\x02").decode()

    async def go(url):
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(url.replace("http://", "ws://") + "/v1/realtime") as ws:
                assert (await ws.receive_json(timeout=10))["type"] == "session.created"
                await ws.send_json({"type": "session.update", "session": {"turn_detection": None}})
                assert (await ws.receive_json(timeout=10))["type"] == "session.updated"
                await ws.send_json({"type": "input_audio_buffer.append", "audio": odd})
                appended = await ws.receive_json(timeout=10)
                await ws.send_json({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user", "id": "mine\n",
                    "content": [{"type": "input_text", "text": "hi"}]}})
                bad_id = await ws.receive_json(timeout=10)
                await ws.send_json({"type": "input_audio_buffer.commit"})
                committed = await ws.receive_json(timeout=10)
                return appended, bad_id, committed

    with LiveServer(mode="inline", config=ServerConfig(port=0)) as server:
        appended, bad_id, committed = asyncio.run(asyncio.wait_for(go(server.url), 30))
        assert appended["type"] == "error" and appended["error"]["code"] == "invalid_audio", appended
        assert "201 bytes" in appended["error"]["message"]
        assert bad_id["type"] == "error" and bad_id["error"]["param"] == "item.id", bad_id
        # nothing of the odd append was kept: the buffer is empty, so a commit is refused
        assert committed["type"] == "error" and committed["error"]["code"] == "input_audio_buffer_commit_empty", committed
        assert server.state().budgets["realtime_audio"].used == 0


def test_an_unreadable_image_error_names_no_object_address():
    with pytest.raises(ApiError) as err:
        _check_image(base64.b64decode("bm90IGFuIGltYWdl"), "image_url", MediaLimits())
    assert " at 0x" not in str(err.value) and "not a readable image" in str(err.value)


def test_a_connection_gone_mid_stream_is_one_log_line_not_a_traceback(monkeypatch, caplog):
    """After a stage dies a stream ends on an error event; a client that leaves on it makes the next
    write fail. That is one clean line, not aiohttp's "Error handling request" traceback."""
    import logging

    import requests
    from aiohttp import web

    from omni.api import routes_chat
    from test_api_support import LiveServer

    async def leaves_mid_stream(request):
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"data: {}\n\n")
        raise ConnectionResetError("Cannot write to closing transport")

    monkeypatch.setattr(routes_chat, "chat_completions", leaves_mid_stream)
    with caplog.at_level(logging.INFO), LiveServer(mode="inline") as srv:
        with pytest.raises(requests.RequestException):
            requests.post(srv.url + "/v1/chat/completions", json={}, timeout=10).content
    assert not [r for r in caplog.records if "Error handling request" in r.getMessage() or r.exc_info]
    assert [r for r in caplog.records if "the connection ended mid-response" in r.getMessage()]


def _prompt(seed: int):
    import numpy as np

    from omni.api.voices import Prompt

    rng = np.random.default_rng(seed)
    return Prompt(rng.standard_normal(256).astype(np.float32), rng.integers(0, 64, (200, 4)), "text")


def test_the_voice_cache_is_trimmed_to_its_bound_at_start_up(tmp_path):
    import os

    from omni.api.budgets import Budget
    from omni.api.voices import VoiceStore

    store = VoiceStore(tmp_path, max_bytes=10 ** 9)
    voices = [store.add(name, _prompt(i), 1.0) for i, name in enumerate("abc")]
    one = store.total_bytes // 3
    for age, voice in enumerate(voices):  # "a" the least recently used, "c" the most
        os.utime(tmp_path / f"{voice.id}.npz", (1000 + age, 1000 + age))
    budget = Budget("voice_cache", int(one * 1.5))
    smaller = VoiceStore(tmp_path, max_bytes=int(one * 1.5), lease=budget.lease())  # a smaller --voice-cache-mb
    assert [v.name for v in smaller.list()] == ["c"] and smaller.total_bytes <= smaller.max_bytes
    assert budget.used == smaller.total_bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{voices[2].id}.json", f"{voices[2].id}.npz"])


def test_voices_of_an_earlier_checkpoint_of_the_model_are_removed_at_start_up(tmp_path):
    from omni.api.voices import VoiceStore

    old = VoiceStore(tmp_path / "tiny-tts-0123456789abcdef")
    old.add("kept-before", _prompt(0), 1.0)
    other_model = VoiceStore(tmp_path / "other-model-0123456789abcdef")
    other_model.add("theirs", _prompt(1), 1.0)
    new = VoiceStore(tmp_path / "tiny-tts-fedcba9876543210")  # the same model id, changed files
    assert new.orphans_removed > 0 and not (tmp_path / "tiny-tts-0123456789abcdef").exists()
    assert [v.name for v in VoiceStore(tmp_path / "other-model-0123456789abcdef").list()] == ["theirs"]


def test_no_error_a_client_sees_carries_an_object_repr():
    """Whatever text a library or a stage puts in an exception, the client's message has no
    `<... object at 0x...>`: HTTP bodies, SSE error events and Realtime error events alike."""
    from omni.api.errors import as_api_error, from_kernel_error
    from omni.api.realtime.response import error_event
    from omni.kernel.errors import InvalidRequest, StageFailed

    repr_text = "cannot identify image file <_io.BytesIO object at 0x7f3a2b1c9e50>"
    errors = [ApiError(400, repr_text), from_kernel_error(InvalidRequest(f"stage preprocess.0: {repr_text}")),
              from_kernel_error(StageFailed(f"thinker.0 died: <Thread(worker, started 0x7f00aa) at 0xDEADBEEF>")),
              as_api_error(ApiError(413, repr_text, param="x"))]
    for err in errors:
        for text in (err.message, str(err), str(err.body()), str(error_event(err))):
            assert " at 0x" not in text and "object at" not in text, text
    assert errors[0].message == "cannot identify image file an object"
    assert "died" in errors[2].message  # the rest of the message stays


def test_leftovers_in_the_voice_cache_are_removed_at_start_up_and_not_counted(tmp_path):
    """A write cut off before its JSON, a temporary file, unreadable metadata and a voice stored
    under a name the rule now refuses ("abc\\n", taken before the rule ended in \\Z): all removed
    when the store opens; the budget counts only the voices served."""
    import json

    from omni.api.budgets import Budget
    from omni.api.voices import VoiceStore

    store = VoiceStore(tmp_path)
    kept, newline = store.add("kept", _prompt(0), 1.0), store.add("abc", _prompt(1), 1.0)
    meta = tmp_path / f"{newline.id}.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "name": "abc\n"}))
    (tmp_path / "voice_cutoff.npz").write_bytes(b"x" * 1000)
    (tmp_path / ".voice_half.tmp").write_bytes(b"x" * 1000)
    (tmp_path / "voice_broken.json").write_text("{not json")
    budget = Budget("voice_cache", 10 ** 9)
    reopened = VoiceStore(tmp_path, lease=budget.lease())
    assert [v.name for v in reopened.list()] == ["kept"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{kept.id}.json", f"{kept.id}.npz"])
    assert budget.used == reopened.total_bytes == sum(p.stat().st_size for p in tmp_path.iterdir())
