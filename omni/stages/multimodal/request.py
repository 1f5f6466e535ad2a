"""The request params contract of the omni families' stages (Qwen3-Omni, Qwen2.5-Omni): what omnid puts in `params`.

    {"task": "chat" | "speech" | "transcribe" | "encode",
     "messages": [{"role", "content": str | [{"type": "text", "text"},
                                             {"type": "audio", "pcm": float32-LE bytes, "sample_rate"},
                                             {"type": "image", "data": encoded image bytes}]}],
     "modalities": ["text"] | ["text", "audio"] | ["audio"],
     "voice": str | None,
     "sampling": {"thinker": {...}, "talker": {...}},
     "input": str,                      # speech task: the text to say
     "audio": {"pcm", "sample_rate"},   # transcribe task: the audio to transcribe; encode task: the
                                        # start of a clip still being spoken (see `ENCODE`)
     "language": str | None, "prompt": str | None}   # transcribe task hints

Every stage sees the same params (the kernel forwards them whole), so the rules that several
stages must agree on (does this request want audio? which voice?) live here, once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omni.kernel.errors import InvalidRequest

TASKS = ("chat", "speech", "transcribe", "complete", "encode")
# the encode task answers nothing: it encodes the complete attention windows of a clip still being
# spoken into the audio encoder's cache (a Realtime turn), so that its chat request finds them there
ENCODE = "encode"
SPEECH_INSTRUCTION = "Read the following text aloud, exactly as written, and say nothing else:\n"
TRANSCRIBE_INSTRUCTION = "Transcribe the audio into text."


def wants_audio(params: dict[str, Any]) -> bool:
    """Audio out unless the request's modalities leave it out; no modalities = the graph's full output."""
    modalities = params.get("modalities")
    return modalities is None or "audio" in modalities


def needs(params: dict[str, Any]) -> set[str]:
    """The capabilities (graph.py's stage capabilities) a request needs, so it skips the stages of
    the others: a text chat never touches the encoders or the talker. Anything not understood here
    counts as needing everything."""
    caps = {"audio_output"} if wants_audio(params) else set()
    if params.get("task") in ("transcribe", ENCODE):
        caps.add("audio_input")
    for message in params.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str) or content is None:
            continue
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                continue
            caps |= {"audio": {"audio_input"}, "image": {"image_input"}}.get(kind, {"audio_input", "image_input"})
    return caps


def prompt_chars(messages: list[dict[str, Any]]) -> int:
    """Characters of text in chat messages (what a prompt's length bound counts first)."""
    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return total


def voice_of(params: dict[str, Any]) -> str | None:
    """The requested speaker (`voice`, or the lower-level `speaker`), lower-cased as the checkpoint keys are."""
    voice = params.get("voice") or params.get("speaker")
    return str(voice).strip().lower() if voice else None


def check_voice(params: dict[str, Any], voices: list[str]) -> None:
    voice = voice_of(params)
    if voice is not None and voice not in voices:
        raise InvalidRequest(f"unknown voice {voice!r}; this model's voices are: {', '.join(voices)}")


def completion_text(params: dict[str, Any]) -> str | None:
    """The raw text of a text completion (task "complete": no chat template), else None."""
    if params.get("task") != "complete":
        return None
    text = params.get("prompt")
    if not isinstance(text, str) or not text:
        raise InvalidRequest("the complete task needs a non-empty 'prompt' text")
    return text


def chat_messages(params: dict[str, Any]) -> list[dict[str, Any]]:
    """The request as chat messages in `Preprocessor`'s format (media decoded to arrays / bytes).

    The speech task asks the model to say `input`; the transcribe task asks it to transcribe
    `audio`; the complete task's prompt is one user text (`completion_text` is what is tokenized).
    A random-weight checkpoint says noise either way."""
    task = params.get("task", "chat")
    if task not in TASKS:
        raise InvalidRequest(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")
    if task == "complete":
        return [{"role": "user", "content": completion_text(params)}]
    if task == "speech":
        text = params.get("input")
        if not isinstance(text, str) or not text.strip():
            raise InvalidRequest("the speech task needs a non-empty 'input' text")
        return [{"role": "user", "content": SPEECH_INSTRUCTION + text}]
    if task == ENCODE:
        audio = params.get("audio")
        if not isinstance(audio, dict):
            raise InvalidRequest("the encode task needs 'audio': {'pcm', 'sample_rate'}")
        return [{"role": "user", "content": [_audio_item(audio)]}]
    if task == "transcribe":
        audio = params.get("audio")
        if not isinstance(audio, dict):
            raise InvalidRequest("the transcribe task needs 'audio': {'pcm', 'sample_rate'}")
        instruction = TRANSCRIBE_INSTRUCTION
        if params.get("language"):
            instruction = f"Transcribe the {params['language']} audio into text."
        if params.get("prompt"):
            instruction += f" Context: {params['prompt']}"
        return [{"role": "user", "content": [_audio_item(audio), {"type": "text", "text": instruction}]}]
    messages = params.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list")
    return [_message(m, i) for i, m in enumerate(messages)]


def _message(message: Any, index: int) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise InvalidRequest(f"messages[{index}] needs a role")
    content = message.get("content")
    if content is None or isinstance(content, str):
        out = {"role": message["role"], "content": content or ""}
        ids = message.get("token_ids")  # an earlier answer as generated (prompt_splice.py)
        if ids is not None and message["role"] == "assistant":
            if not isinstance(ids, list) or not all(isinstance(t, int) and t >= 0 for t in ids):
                raise InvalidRequest(f"messages[{index}].token_ids must be a list of token ids")
            out["token_ids"] = ids
        return out
    if not isinstance(content, list):
        raise InvalidRequest(f"messages[{index}].content must be a string or a list of parts")
    items = []
    for j, item in enumerate(content):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "text":
            items.append({"type": "text", "text": str(item.get("text", ""))})
        elif kind in ("audio", "input_audio"):
            items.append(_audio_item(item))
        elif kind in ("image", "image_url"):
            data = item.get("data", item.get("image"))
            if data is None:
                raise InvalidRequest(f"messages[{index}].content[{j}]: image part without data")
            items.append({"type": "image", "image": data})
        elif kind in ("video", "video_url"):
            data = item.get("data", item.get("video"))
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise InvalidRequest(f"messages[{index}].content[{j}]: video part without the file's bytes")
            video = {"type": "video", "data": bytes(data)}
            if item.get("fps") is not None:  # frames sampled a second (the processor's `fps`)
                fps = item["fps"]
                if not isinstance(fps, (int, float)) or not 0 < fps <= 60:
                    raise InvalidRequest(f"messages[{index}].content[{j}]: video fps must be in (0, 60], got {fps!r}")
                video["fps"] = float(fps)
            if item.get("audio") is not None:  # its audio track (use_audio_in_video), as an audio part's
                video["audio"] = _audio_item(item["audio"])["audio"]
            items.append(video)
        else:
            raise InvalidRequest(f"messages[{index}].content[{j}]: unsupported content type {kind!r}")
    return {"role": message["role"], "content": items}


def _audio_item(item: dict[str, Any]) -> dict[str, Any]:
    pcm = item.get("pcm")
    if pcm is None and isinstance(item.get("audio"), dict):
        return {"type": "audio", "audio": item["audio"]}
    if pcm is None:
        raise InvalidRequest("audio part without pcm")
    if isinstance(pcm, (bytes, bytearray, memoryview)):
        if len(pcm) % 4:
            raise InvalidRequest("audio pcm must be float32 little-endian bytes (a multiple of 4)")
        pcm = np.frombuffer(pcm, dtype="<f4").astype(np.float32)
    rate = item.get("sample_rate", 16000)
    if not isinstance(rate, int) or rate <= 0:
        raise InvalidRequest(f"audio sample_rate must be a positive integer, got {rate!r}")
    return {"type": "audio", "audio": {"pcm": np.asarray(pcm, dtype=np.float32), "sample_rate": rate}}
