"""A Realtime session's conversation: its items in order, as OpenAI renders them and as the chat
messages (the kernel's params contract) each response is generated from.

User audio is kept as 16 kHz float32 (what the audio encoders take); for a model that does not hear,
each audio turn carries the transcript the served Whisper made of it instead. What it holds (audio
and text) is on a lease of the server's `conversation` budget, shared by every session.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni.api.budgets import Lease
from omni.api.errors import bad_request
from omni.api.media import audio_part
from omni.api.names import check_name
from omni.api.realtime.vad import VAD_RATE

ROLES = ("user", "assistant", "system")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass
class Part:
    kind: str  # "input_text" | "input_audio" | "text" | "audio" (assistant output)
    text: str = ""  # the text, or the audio's transcript (None-like "" until known)
    pcm: np.ndarray | None = None  # user audio, 16 kHz float32
    transcribed: bool = False  # an input_audio whose transcript is known
    audio_ms: int = 0  # assistant audio sent so far
    token_ids: list[int] | None = None  # an answer's ids as generated: the next prompt reuses them (prefix cache)

    def render(self, beta: bool) -> dict:
        if self.kind == "input_text":
            return {"type": "input_text", "text": self.text}
        if self.kind == "input_audio":
            return {"type": "input_audio", "transcript": self.text if self.transcribed else None}
        if self.kind == "text":
            return {"type": "text" if beta else "output_text", "text": self.text}
        return {"type": "audio" if beta else "output_audio", "transcript": self.text}


@dataclass
class Item:
    role: str
    parts: list[Part] = field(default_factory=list)
    id: str = field(default_factory=lambda: new_id("item"))
    status: str = "completed"

    def render(self, beta: bool) -> dict:
        return {"id": self.id, "object": "realtime.item", "type": "message", "status": self.status,
                "role": self.role, "content": [p.render(beta) for p in self.parts]}

    def nbytes(self) -> int:
        return sum((p.pcm.nbytes if p.pcm is not None else 0) + len(p.text.encode()) + 8 * len(p.token_ids or ())
                   for p in self.parts)

    def untranscribed(self) -> list[Part]:
        return [p for p in self.parts if p.kind == "input_audio" and not p.transcribed]


def pcm16_to_float(data: bytes) -> np.ndarray:
    """pcm16 is two bytes a sample: an odd count is a client's bug, refused rather than cut."""
    if len(data) % 2:
        raise bad_request(f"pcm16 audio is 2 bytes a sample; got {len(data)} bytes", param="audio",
                          code="invalid_audio")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def item_from_event(body: Any, resample_24k) -> Item:
    """`conversation.item.create`'s item: a message of input_text / input_audio (user, system) or
    text (assistant) parts. `resample_24k` takes 24 kHz float32 to 16 kHz."""
    where = "item"
    if not isinstance(body, dict):
        raise bad_request("item must be an object", param=where, code="invalid_type")
    if body.get("type", "message") != "message":
        raise bad_request(f"item.type {body.get('type')!r} is not served; only 'message'", param="item.type",
                          code="unsupported_item_type")
    given = body.get("id")
    if given is not None and given != "":  # a client's own id: the one name rule (names.py)
        check_name(given, "item.id, when given,", "item.id")
    role = body.get("role")
    if role not in ROLES:
        raise bad_request(f"item.role must be one of {list(ROLES)}", param="item.role", code="invalid_value")
    content = body.get("content")
    if not isinstance(content, list) or not content:
        raise bad_request("item.content must be a non-empty list of parts", param="item.content",
                          code="invalid_value")
    parts = []
    for i, raw in enumerate(content):
        param = f"item.content[{i}]"
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind in ("input_text", "text", "output_text"):
            text = raw.get("text")
            if not isinstance(text, str):
                raise bad_request(f"{param}.text must be a string", param=f"{param}.text", code="invalid_type")
            parts.append(Part("text" if role == "assistant" else "input_text", text))
        elif kind == "input_audio" and role == "user":
            audio = raw.get("audio")
            if not isinstance(audio, str) or not audio:
                raise bad_request(f"{param}.audio must be base64 pcm16 (24 kHz mono)", param=f"{param}.audio",
                                  code="invalid_type")
            pcm = resample_24k(pcm16_to_float(_b64(audio, f"{param}.audio")))
            transcript = raw.get("transcript")
            parts.append(Part("input_audio", transcript if isinstance(transcript, str) else "", pcm,
                              transcribed=isinstance(transcript, str)))
        else:
            allowed = "input_text, input_audio" if role == "user" else ("text" if role == "assistant" else "input_text")
            raise bad_request(f"{param}.type {kind!r} is not served for role {role!r}; use {allowed}",
                              param=f"{param}.type", code="invalid_value")
    return Item(role, parts, id=given or new_id("item"))


def _b64(data: str, param: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except ValueError as exc:
        raise bad_request(f"{param} is not valid base64: {exc}", param=param, code="invalid_base64") from None


def generated(item: Item) -> dict:
    """An answer's `token_ids` when every part of it still is what the model generated."""
    ids = [p.token_ids for p in item.parts]
    if item.role != "assistant" or any(i is None for i in ids):
        return {}
    return {"token_ids": [t for part in ids for t in part]}


class Conversation:
    def __init__(self, lease: Lease) -> None:
        self.items: list[Item] = []
        self.lease = lease

    def add(self, item: Item, after: Any = None) -> str | None:
        """Insert after item `after` (None: at the end, "root": first); returns the id of the item
        before it (what `conversation.item.created` names). Past the total budget: a 429, not added."""
        if self.find(item.id) is not None:
            raise bad_request(f"an item with id {item.id!r} already exists", param="item.id", code="duplicate_id")
        self.lease.resize(self.nbytes() + item.nbytes())
        if after is None:
            at = len(self.items)
        elif after == "root":
            at = 0
        else:
            at = self.items.index(self.get(after, "previous_item_id")) + 1
        self.items.insert(at, item)
        return self.items[at - 1].id if at else None

    def find(self, item_id: str) -> Item | None:
        return next((i for i in self.items if i.id == item_id), None)

    def get(self, item_id: Any, param: str = "item_id") -> Item:
        found = self.find(item_id) if isinstance(item_id, str) else None
        if found is None:
            raise bad_request(f"no item with id {item_id!r} in this conversation", param=param, code="item_not_found")
        return found

    def delete(self, item_id: Any) -> Item:
        item = self.get(item_id)
        self.items.remove(item)
        self.settle()
        return item

    def nbytes(self) -> int:
        return sum(item.nbytes() for item in self.items)

    def settle(self) -> None:
        """Account what the items hold now (answers and transcripts grow them after they were added)."""
        self.lease.settle(self.nbytes())

    def close(self) -> None:
        self.items = []
        self.lease.close()

    def audio_seconds(self) -> float:
        return sum(len(p.pcm) for i in self.items for p in i.parts if p.pcm is not None) / VAD_RATE

    def messages(self, instructions: str, hears: bool) -> list[dict]:
        """The chat messages of the whole conversation, instructions first."""
        out: list[dict] = [{"role": "system", "content": instructions}] if instructions else []
        for item in self.items:
            parts: list[dict] = []
            for p in item.parts:
                if p.kind == "input_audio" and hears and p.pcm is not None and len(p.pcm):
                    parts.append({"type": "audio", **audio_part(p.pcm, VAD_RATE)})
                elif p.text:
                    parts.append({"type": "text", "text": p.text})
            if not parts:
                continue  # e.g. an answer truncated before any of it was heard
            if item.role != "user" or all(p["type"] == "text" for p in parts):
                out.append({"role": item.role, "content": "".join(p["text"] for p in parts if p["type"] == "text"),
                            **generated(item)})
            else:
                out.append({"role": item.role, "content": parts})
        return out
