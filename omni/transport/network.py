"""The network channel: arrays between stages on different hosts, as ZeroMQ frames over TCP.

The actor picks it for a (edge, consumer replica) whose ends were placed on different nodes. The
bytes ride as extra frames beside the chunk's bus message (the bus is ZeroMQ over TCP across hosts):
one hop, no second connection, no pickle (dtype and shape are in the msgspec PayloadDesc). A write
is one copy, into a frame the zmq IO thread sends later, so the producer may reuse its tensor at
once; a read is a zero-copy view of the received frame. As with shm, the bytes in flight are
bounded: a writer holds at most `capacity_bytes` (the stage's arena_bytes) that its consumers have
not credited back, and raises ChannelFull past it, so a slow consumer on another host holds back
its producer instead of filling zmq's queues. A consumer on a GPU gets the array on its device.

`$OMNI_NETWORK_TRANSPORT` picks the wire: "zmq" (default). "nixl" and "mooncake" (GPU-to-GPU
RDMA) are refused with a clear error: omni does not drive them yet, installed or not.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

from omni.transport.channels import ChannelFull
from omni.kernel.errors import PayloadTooLarge
from omni.kernel.messages import PayloadDesc
from omni.transport.arrays import from_buffer
from omni.transport.shm import DEFAULT_CAPACITY, _flat_bytes, token_bytes, token_of

RDMA = {"nixl": "nixl", "mooncake": "mooncake"}  # transport -> the module it would need


def check_transport() -> None:
    """Refuse an RDMA wire omni cannot drive, saying why (and whether it is installed)."""
    wire = os.environ.get("OMNI_NETWORK_TRANSPORT", "zmq")
    if wire == "zmq":
        return
    if wire not in RDMA:
        raise ValueError(f"OMNI_NETWORK_TRANSPORT must be one of zmq, nixl, mooncake, not {wire!r}")
    try:
        __import__(RDMA[wire])
        found = "it is installed, but"
    except ImportError:
        found = f"it is not installed ({RDMA[wire]} does not import), and"
    raise RuntimeError(f"network transport {wire!r}: {found} omni's network channel drives only zmq (TCP) "
                       "for now; unset OMNI_NETWORK_TRANSPORT")


class NetworkWriter:
    """Producer side: the bytes of each array as one frame, and the tally of bytes not credited back."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self._live: dict[int, int] = {}  # token -> its bytes, until the consumer's credit returns it
        self._used = 0
        self._tokens = itertools.count(1)
        self._closed = False

    def write(self, name: str, array: Any) -> tuple[PayloadDesc, list[Any]]:
        if self._closed:
            raise RuntimeError("network writer is closed")
        flat, dtype, shape = _flat_bytes(array)
        desc = PayloadDesc(name=name, channel="network", dtype=dtype, shape=shape, nbytes=flat.size)
        if flat.size == 0:
            return desc, []  # empty arrays take no slot and need no credit
        if flat.size > self.capacity:
            raise PayloadTooLarge(f"a payload of {flat.size} bytes exceeds the whole arena ({self.capacity} "
                                  "bytes in flight; raise the stage's arena_bytes to send it)")
        if self._used + flat.size > self.capacity:
            raise ChannelFull(f"network channel: {self._used} of {self.capacity} bytes in flight, no room for "
                              f"{flat.size} more until a consumer credits some back")
        token = next(self._tokens)
        self._live[token] = flat.size
        self._used += flat.size
        desc.extra = token_bytes(token)
        return desc, [flat.tobytes()]

    def free(self, token: int) -> bool:
        """Take a slot back; False if `token` is not live (a stale credit after `free_all`)."""
        size = self._live.pop(token, None)
        if size is None:
            return False
        self._used -= size
        return True

    def free_all(self) -> None:
        self._live.clear()
        self._used = 0

    def stats(self) -> dict[str, int]:
        return {"capacity": self.capacity, "used": self._used, "live": len(self._live)}

    def close(self) -> None:
        self._closed = True
        self.free_all()


class NetworkReader:
    """Consumer side: views of the received frames (on `device` when it is a GPU)."""

    def __init__(self) -> None:
        self.device: str | None = None

    def read(self, desc: PayloadDesc, frames: list[Any]) -> Any:
        if desc.nbytes == 0:
            return from_buffer(bytearray(), desc.dtype, desc.shape)
        if not 0 <= desc.frame < len(frames):
            raise ValueError(f"payload {desc.name!r} names frame {desc.frame}; the message has {len(frames)}")
        buffer = memoryview(frames[desc.frame])
        if buffer.nbytes != desc.nbytes:
            raise ValueError(f"payload {desc.name!r}: frame of {buffer.nbytes} bytes, descriptor says {desc.nbytes}")
        array = from_buffer(buffer, desc.dtype, desc.shape)
        if self.device and self.device.startswith("cuda"):
            import warnings

            import torch

            with warnings.catch_warnings():  # a received frame is read-only; the copy to the GPU is not
                warnings.simplefilter("ignore", UserWarning)
                tensor = array if isinstance(array, torch.Tensor) else torch.from_numpy(array)
            return tensor.to(self.device)
        return array

    def token(self, desc: PayloadDesc) -> int | None:
        return token_of(desc)

    def close(self) -> None:
        pass


class NetworkChannel:
    """Across hosts: one copy into a frame, the frame over TCP, zero copies out."""

    name = "network"

    @staticmethod
    def writer(owner: str = "", capacity_bytes: int = 0) -> NetworkWriter:
        """`capacity_bytes` 0 means DEFAULT_CAPACITY (64 MiB) in flight."""
        check_transport()
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        return NetworkWriter(capacity_bytes or DEFAULT_CAPACITY)

    @staticmethod
    def reader() -> NetworkReader:
        check_transport()
        return NetworkReader()
