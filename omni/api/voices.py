"""Uploaded voices of a model that clones them (`ModelInfo.clones_voices`): each voice's
prompt (speaker embedding, reference codes, transcript) is computed once by the model's own graph,
then kept here: in memory, and on disk under omni's cache directory, so it survives a restart.

The disk copy is bounded (`max_bytes` in all): adding a voice past the bound evicts the least
recently used ones (use = a request speaking in it; recency is the arrays file's mtime, so it
survives a restart too). Voices belong to one checkpoint: the directory is keyed by the model's
files (a changed checkpoint starts with no voices rather than with prompts of other weights, and
the directory of the earlier one is removed at start-up). At start-up the cache is trimmed to
`max_bytes` too (the bound may have shrunk since the voices were made).

Files: `<id>.npz` (the arrays) and `<id>.json` (the rest), written atomically; a voice exists once
its JSON does. Nothing here knows a model family: the prompt is opaque bytes in the params the
family's voice stage defines (`voice_prompt`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omni.api.budgets import Lease
from omni.api.errors import ApiError, bad_request
from omni.api.names import check_name as _check_name
from omni.api.names import is_name

log = logging.getLogger("omni.api.voices")
DEFAULT_MAX_BYTES = 256 << 20


@dataclass
class Voice:
    id: str
    name: str
    created_at: int
    ref_text: str | None
    seconds: float  # the clip's length
    num_frames: int  # reference code frames (0: x-vector only)
    consent: str | None = None

    def public(self) -> dict[str, Any]:
        """The voice object routes return (OpenAI's `audio.voice`, plus what omni knows of it)."""
        return {"id": self.id, "object": "audio.voice", "name": self.name, "created_at": self.created_at,
                "ref_text": self.ref_text, "mode": "icl" if self.num_frames else "x_vector",
                "duration": round(self.seconds, 3), "type": "uploaded"}


@dataclass
class Prompt:
    """What the voice stage computed: arrays as numpy."""

    spk_embedding: np.ndarray  # float32 [D]
    ref_codes: np.ndarray | None  # int64 [T, Q]
    ref_text: str | None

    @classmethod
    def from_output(cls, data: dict[str, Any]) -> "Prompt":
        emb = np.asarray(_host(data["spk_embedding"]), dtype=np.float32).reshape(-1)
        codes = data.get("ref_codes")
        codes = None if codes is None else np.asarray(_host(codes), dtype=np.int64)
        return cls(emb, codes, data.get("ref_text"))

    def params(self) -> dict[str, Any]:
        """The `voice_prompt` request param (msgpack-safe: arrays as little-endian bytes)."""
        codes = self.ref_codes
        return {"spk_embedding": self.spk_embedding.astype("<f4").tobytes(),
                "ref_codes": None if codes is None else codes.astype("<i8").tobytes(),
                "num_frames": 0 if codes is None else int(codes.shape[0]), "ref_text": self.ref_text}


def _host(x: Any) -> Any:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else x


def namespace(info) -> str:
    """A directory name for one checkpoint's voices: the model id plus a digest of its files."""
    digest = hashlib.sha1(f"{info.family}\0{info.id}".encode())
    model_dir = info.model_dir
    if model_dir:
        root = Path(model_dir)
        for path in sorted(p for p in [root, *root.glob("*"), *root.glob("*/*")] if p.is_file()):
            st = path.stat()
            digest.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", info.id)[:48]
    return f"{safe}-{digest.hexdigest()[:16]}"


class VoiceStore:
    def __init__(self, root: str | Path, max_bytes: int = DEFAULT_MAX_BYTES, lease: Lease | None = None) -> None:
        self.root = Path(root)
        self.max_bytes = int(max_bytes)
        self.lease = lease  # the server's voice_cache budget, told what the files take
        self.root.mkdir(parents=True, exist_ok=True)
        self._voices: dict[str, Voice] = {}
        self._prompts: dict[str, Prompt] = {}
        self.orphans_removed = remove_orphans(self.root)
        self._load()
        self._evict(keep=None)  # a smaller --voice-cache-mb than last time holds from the start
        self._settle()

    # ---- lookup ---------------------------------------------------------------------------

    def find(self, key: str) -> Voice | None:
        """By id, else by name (case-insensitive)."""
        if key in self._voices:
            return self._voices[key]
        lowered = key.strip().lower()
        return next((v for v in self._voices.values() if v.name.lower() == lowered), None)

    def list(self) -> list[Voice]:
        return sorted(self._voices.values(), key=lambda v: (v.created_at, v.id))

    def prompt(self, voice: Voice) -> Prompt:
        """The voice's prompt, marking it used (its recency decides what is evicted first)."""
        prompt = self._prompts.get(voice.id)
        if prompt is None:
            prompt = self._prompts[voice.id] = self._read_arrays(voice)
        try:
            os.utime(self._arrays(voice.id))
        except OSError:
            pass
        return prompt

    @property
    def total_bytes(self) -> int:
        return sum(self._size(v.id) for v in self._voices.values())

    # ---- changes ------------------------------------------------------------------------------

    def add(self, name: str, prompt: Prompt, seconds: float, consent: str | None = None) -> Voice:
        check_name(name)
        if self.find(name) is not None:
            raise ApiError(409, f"a voice named {name!r} exists; delete it first or pick another name", param="name",
                           code="voice_exists")
        voice = Voice(id="voice_" + secrets.token_hex(12), name=name, created_at=int(time.time()),
                      ref_text=prompt.ref_text, seconds=float(seconds),
                      num_frames=0 if prompt.ref_codes is None else int(prompt.ref_codes.shape[0]), consent=consent)
        self._write(voice, prompt)
        size = self._size(voice.id)
        if size > self.max_bytes:
            self._remove_files(voice.id)
            raise ApiError(413, f"the voice takes {size} bytes; the voice cache holds at most {self.max_bytes}",
                           param="audio_sample", code="too_large")
        self._voices[voice.id] = voice
        self._prompts[voice.id] = prompt
        self._evict(keep=voice.id)
        self._settle()
        return voice

    def delete(self, key: str) -> Voice | None:
        voice = self.find(key)
        if voice is not None:
            del self._voices[voice.id]
            self._prompts.pop(voice.id, None)
            self._remove_files(voice.id)
            self._settle()
        return voice

    def _settle(self) -> None:
        if self.lease is not None:
            self.lease.settle(self.total_bytes)

    def _evict(self, keep: str | None) -> None:
        """Least recently used first, until the files fit `max_bytes`."""
        by_age = sorted((v for v in self._voices.values() if v.id != keep), key=lambda v: self._last_used(v.id))
        total = self.total_bytes
        for voice in by_age:
            if total <= self.max_bytes:
                break
            total -= self._size(voice.id)
            log.info("voice cache over %d bytes: evicting %s (%s)", self.max_bytes, voice.id, voice.name)
            self.delete(voice.id)

    # ---- files -----------------------------------------------------------------------------------

    def _arrays(self, vid: str) -> Path:
        return self.root / f"{vid}.npz"

    def _meta(self, vid: str) -> Path:
        return self.root / f"{vid}.json"

    def _size(self, vid: str) -> int:
        return sum(p.stat().st_size for p in (self._arrays(vid), self._meta(vid)) if p.exists())

    def _last_used(self, vid: str) -> float:
        try:
            return self._arrays(vid).stat().st_mtime
        except OSError:
            return 0.0

    def _write(self, voice: Voice, prompt: Prompt) -> None:
        arrays = {"spk_embedding": prompt.spk_embedding.astype(np.float32)}
        if prompt.ref_codes is not None:
            arrays["ref_codes"] = prompt.ref_codes.astype(np.int64)
        tmp = self.root / f".{voice.id}.npz.tmp"
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, self._arrays(voice.id))
        tmp = self.root / f".{voice.id}.json.tmp"
        tmp.write_text(json.dumps(asdict(voice)))
        os.replace(tmp, self._meta(voice.id))

    def _read_arrays(self, voice: Voice) -> Prompt:
        with np.load(self._arrays(voice.id)) as z:
            codes = z["ref_codes"] if "ref_codes" in z.files else None
            return Prompt(z["spk_embedding"].astype(np.float32), None if codes is None else codes.astype(np.int64),
                          voice.ref_text)

    def _remove_files(self, vid: str) -> None:
        for path in (self._meta(vid), self._arrays(vid)):  # the JSON first: no half voice is ever listed
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    def _load(self) -> None:
        for meta in self.root.glob("voice_*.json"):
            try:
                voice = Voice(**json.loads(meta.read_text()))
                if not self._arrays(voice.id).is_file():
                    raise FileNotFoundError(self._arrays(voice.id))
                if not is_name(voice.name):  # made before the name rule ended in \Z ("abc\n" was taken)
                    raise ValueError(f"its name {voice.name!r} breaks the name rule")
            except (OSError, ValueError, TypeError) as exc:
                log.warning("dropping unreadable voice %s: %s", meta.name, exc)
                self._remove_files(meta.stem)
                continue
            self._voices[voice.id] = voice
        for orphan in self.root.glob("voice_*.npz"):  # a write cut off before its JSON
            if orphan.stem not in self._voices:
                orphan.unlink(missing_ok=True)
        for tmp in self.root.glob(".voice_*.tmp"):
            tmp.unlink(missing_ok=True)


_NAMESPACE_RE = re.compile(r"(.+)-[0-9a-f]{16}\Z")


def remove_orphans(root: Path) -> int:
    """Remove the voice directories of this model's earlier checkpoints (a sibling named like `root`,
    the same model id, with another files digest: no weights served can use their prompts). Returns
    the bytes removed."""
    match = _NAMESPACE_RE.match(root.name)
    if match is None or not root.parent.is_dir():
        return 0
    removed = 0
    for other in root.parent.iterdir():
        found = _NAMESPACE_RE.match(other.name)
        if other == root or not other.is_dir() or found is None or found.group(1) != match.group(1):
            continue
        size = sum(p.stat().st_size for p in other.iterdir() if p.is_file())
        shutil.rmtree(other, ignore_errors=True)
        removed += size
        log.info("removed %s: voices of an earlier checkpoint of this model (%d bytes)", other, size)
    return removed


def check_name(name: str) -> None:
    _check_name(name, "a voice name", "name")  # the one name rule (names.py)
    if name.startswith("voice_"):
        raise bad_request("voice names may not start with 'voice_' (ids do)", param="name", code="invalid_value")
