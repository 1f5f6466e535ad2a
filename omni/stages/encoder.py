"""The encoder stage: batches the pending inputs of many requests into one forward.

A request's inputs arrive as chunks (one per audio / image, any port) and are encoded once
its input has ended; its outputs leave in input order, one chunk per input. Each step runs one forward
over up to `max_batch` inputs that share the batch key of the oldest pending input (inputs with equal
keys give the same outputs batched or alone; oldest first, so none waits behind a busier key), then emits every
finished request's outputs, in input order, and ends it. An optional LRU cache keyed by a
hash of the input's content skips inputs seen before (the same image in many requests, a spoken
conversation's earlier clips, which every turn re-sends); it is bounded by entries and by bytes.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from omni.kernel.stage import Emit, Stage, StageContext
from omni.stages.args import EncoderArgs, coerce_args
from omni.stages.threads import pin_torch_threads


class BatchEncoder(Protocol):
    """What the stage needs of a model: torch stays inside it."""

    def batch_key(self, item: dict[str, Any]) -> Hashable: ...

    def encode(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One output dict (arrays and small values) per input item, in order."""
        ...


def content_hash(item: dict[str, Any]) -> str:
    """A digest of every array's dtype, shape and bytes and every other value's repr."""
    h = hashlib.blake2b(digest_size=20)
    for key in sorted(item):
        value = item[key]
        h.update(key.encode())
        if isinstance(value, np.ndarray):
            h.update(f"{value.dtype}{value.shape}".encode())
            h.update(np.ascontiguousarray(value).tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


@dataclass
class EncoderRequest:
    items: list[dict[str, Any]] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)  # filled only when the cache is on
    outputs: dict[int, dict[str, Any]] = field(default_factory=dict)
    closed: bool = False

    def done(self) -> bool:
        return self.closed and len(self.outputs) == len(self.items)


class EncoderStage(Stage):
    """args: `EncoderArgs` (omni/stages/args.py; a subclass names its own class in `Args`).
    Subclasses provide the model in `build_encoder`."""

    Args: type[EncoderArgs] = EncoderArgs

    def __init__(self, ctx: StageContext, encoder: BatchEncoder | None = None) -> None:
        ctx.args = coerce_args(self.Args, ctx.args, ctx.name)
        super().__init__(ctx)
        self.encoder = encoder
        self.max_batch = ctx.args.max_batch
        self.cache_size = ctx.args.cache_size
        self.cache_bytes = ctx.args.cache_mb << 20
        self._cached_bytes = 0
        self.out_port = ctx.args.out_port or (ctx.out_ports[0] if ctx.out_ports else "out")
        self.cache: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.requests: dict[str, EncoderRequest] = {}
        self.forwards = 0
        self.encoded = 0
        self.cache_hits = 0

    def build_encoder(self) -> BatchEncoder:
        raise NotImplementedError("pass an encoder or override build_encoder")

    def setup(self) -> None:
        pin_torch_threads(self.ctx.args.threads)
        if self.encoder is None:
            self.encoder = self.build_encoder()

    def open(self, rid: str, params: dict[str, Any]) -> None:
        self.requests[rid] = EncoderRequest()

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        item = {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v) for k, v in data.items()}
        self.encoder.batch_key(item)  # rejects malformed inputs now, not in a batch
        req = self.requests[rid]
        req.items.append(item)
        if self.cache_size:
            key = content_hash(item)
            req.hashes.append(key)
            if key in self.cache:
                self.cache.move_to_end(key)
                req.outputs[len(req.items) - 1] = self.cache[key]
                self.cache_hits += 1

    def close_input(self, rid: str) -> None:
        self.requests[rid].closed = True

    def abort(self, rid: str) -> None:
        self.requests.pop(rid, None)

    def has_work(self) -> bool:
        return any(r.closed for r in self.requests.values())

    def backlog(self) -> int:
        return sum(len(r.items) - len(r.outputs) for r in self.requests.values())

    def step(self) -> list[Emit]:
        pending = [(rid, i, item) for rid, r in self.requests.items() if r.closed
                   for i, item in enumerate(r.items) if i not in r.outputs]
        if pending:
            groups: dict[Hashable, list[tuple[str, int, dict]]] = {}
            for entry in pending:
                groups.setdefault(self.encoder.batch_key(entry[2]), []).append(entry)
            # the oldest pending input's group, not the largest: under load an input whose key few
            # share (a short clip's pad_len) would otherwise wait for as long as others keep coming
            batch = next(iter(groups.values()))[: self.max_batch]
            outputs = self.encoder.encode([item for _, _, item in batch])
            self.forwards += 1
            self.encoded += len(batch)
            for (rid, i, _), out in zip(batch, outputs):
                req = self.requests[rid]
                req.outputs[i] = out
                if self.cache_size:
                    self._remember(req.hashes[i], out)
        return self._finish_done()

    def stats(self) -> dict[str, Any]:
        return {"running": len(self.requests), "pending_inputs": self.backlog(), "forwards": self.forwards,
                "encoded": self.encoded, "cache_hits": self.cache_hits, "cache_entries": len(self.cache),
                "cache_bytes": self._cached_bytes}

    def _remember(self, key: str, out: dict[str, Any]) -> None:
        size = _nbytes(out)
        if key in self.cache or (self.cache_bytes and size > self.cache_bytes):
            return
        self.cache[key] = out
        self._cached_bytes += size
        while len(self.cache) > self.cache_size or (self.cache_bytes and self._cached_bytes > self.cache_bytes):
            _, old = self.cache.popitem(last=False)
            self._cached_bytes -= _nbytes(old)

    def _finish_done(self) -> list[Emit]:
        emits: list[Emit] = []
        for rid in [rid for rid, r in self.requests.items() if r.done()]:
            r = self.requests.pop(rid)
            n = len(r.items)
            if n == 0:
                emits.append(Emit(rid, finish=True))
            for i in range(n):
                emits.append(Emit(rid, self.out_port, dict(r.outputs[i]), finish=i == n - 1))
        return emits


def _nbytes(out: dict[str, Any]) -> int:
    """Bytes of an output's arrays and tensors (anything with `nbytes`)."""
    return sum(int(getattr(v, "nbytes", 0)) for v in out.values())
