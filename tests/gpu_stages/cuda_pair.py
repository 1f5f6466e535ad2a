"""A producer that makes CUDA tensors and a consumer that checks it got them without a copy."""

from __future__ import annotations

from typing import Any

import torch

from omni.kernel.stage import Emit, Stage

CHUNKS = 8


class CudaProducer(Stage):
    """Emits CHUNKS tensors of 256 x 1024 float32 on the GPU per request, one per step."""

    def setup(self) -> None:
        self.todo: dict[str, int] = {}
        self.device = torch.device(self.ctx.device)

    def open(self, rid: str, params: dict[str, Any]) -> None:
        self.todo[rid] = 0

    def has_work(self) -> bool:
        return bool(self.todo)

    def abort(self, rid: str) -> None:
        self.todo.pop(rid, None)

    def step(self) -> list[Emit]:
        out = []
        for rid in list(self.todo):
            i = self.todo[rid]
            hidden = torch.arange(256 * 1024, device=self.device, dtype=torch.float32).view(256, 1024) + i
            out.append(Emit(rid, "hidden", {"hidden": hidden, "index": i}))
            self.todo[rid] = i + 1
            if i + 1 == CHUNKS:
                out.append(Emit(rid, finish=True))
                del self.todo[rid]
        return out


class CudaConsumer(Stage):
    """Checks each tensor: on the GPU, a view into the producer's pool (zero copy), right values."""

    def setup(self) -> None:
        self.results: dict[str, list[dict[str, Any]]] = {}
        self.done: list[str] = []

    def open(self, rid: str, params: dict[str, Any]) -> None:
        self.results[rid] = []

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        hidden = data["hidden"]
        expected = torch.arange(256 * 1024, device=hidden.device, dtype=torch.float32).view(256, 1024) + data["index"]
        self.results[rid].append({
            "is_cuda": bool(hidden.is_cuda),
            "equal": bool(torch.equal(hidden, expected)),
            # a copy would own a storage of its own size; a view's storage is the whole pool
            "in_pool": hidden.untyped_storage().nbytes() >= (16 << 20) > hidden.nbytes,
        })

    def close_input(self, rid: str) -> None:
        self.done.append(rid)

    def abort(self, rid: str) -> None:
        self.results.pop(rid, None)

    def has_work(self) -> bool:
        return bool(self.done)

    def step(self) -> list[Emit]:
        out = [Emit(rid, "report", {"rows": self.results.pop(rid)}, finish=True) for rid in self.done]
        self.done = []
        return out
