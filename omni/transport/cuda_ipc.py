"""The cuda_ipc channel: a producer-owned device pool exported once through CUDA IPC.

A write is one device-to-device copy into a slot of the pool, on the producer's current stream,
followed by the record of an interprocess event (one of a ring of EVENT_RING, chosen by the
slot's token); the descriptor carries (token, event index) in `extra`. A read makes the
consumer's current stream wait for that event (on the GPU, the host never blocks) and returns a
view of the opened pool: zero copies (when the event has already completed, which a query
tells in ~1 us, the stream does not wait at all). Waiting on an event that a later write has re-recorded is
still correct: that record completes after the one we wanted, on the same stream.

A consumer on another GPU of the host (`reader.device`, set from its replica's placement) gets the
view copied device to device onto its own GPU, on the pool GPU's stream after the event (torch
enables peer access for the copy where the GPUs allow it; otherwise the driver's device-to-device
copy); the host never touches the data. The slot is free again once that copy has run (`fence`).

The pool's IPC handles are published once, in a small JSON sidecar file /dev/shm/<segment>, so
each descriptor stays small and `shm.unlink_prefix(owner)` removes the sidecar of a dead
producer like any segment. The consumer opens the pool on the GPU with the same UUID, so
different CUDA_VISIBLE_DEVICES orderings in the two processes are fine.

Slot reuse: a credit frees the slot at once. If kernels that read a view may still be queued on
the consumer's GPU when the credit is sent, call `reader.fence()` first.

torch is imported inside the functions, so importing this module needs no torch and no GPU.
"""

from __future__ import annotations

import json
import os
import re
import struct
import threading
import weakref
from typing import Any

import numpy as np

from omni.transport.channels import ChannelFull
from omni.kernel.messages import PayloadDesc
from omni.transport.arena import SlotAllocator
from omni.transport.arrays import as_numpy
from omni.transport.shm import SHM_DIR, check_name, segment_path, unique_segment_name, unlink_if_creator

DEFAULT_CAPACITY = 64 << 20
EVENT_RING = 64
_EXTRA = struct.Struct("<QI")  # slot token, event index
_LOCAL_WRITERS: weakref.WeakValueDictionary[str, CudaIpcWriter] = weakref.WeakValueDictionary()


def _torch() -> Any:
    import torch

    return torch


def _to_json(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, (tuple, list)):
        return [_to_json(v) for v in value]
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        return bytes.fromhex(value["hex"])
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def torch_dtype(name: str) -> Any:
    dtype = getattr(_torch(), name, None)
    if not isinstance(dtype, _torch().dtype):
        raise ValueError(f"unknown torch dtype {name!r} in a cuda_ipc descriptor")
    return dtype


def unlink_process_leftovers(pid: int) -> list[str]:
    """Remove the /dev/shm files that torch and the CUDA driver create for a process's IPC
    (`torch_<pid>_*` ref counters, `cuda.shm.<n>.<pid in hex>.<n>` event state) once it is dead.

    They do not start with the owner, so `shm.unlink_prefix` misses them; the driver leaves its
    file behind even after a clean exit. Call only for a pid that has exited.
    """
    pattern = re.compile(rf"torch_{pid}_.*|cuda\.shm\.\d+\.{pid:x}\.\d+")
    removed = []
    for entry in sorted(os.listdir(SHM_DIR)):
        if pattern.fullmatch(entry):
            try:
                os.unlink(os.path.join(SHM_DIR, entry))
                removed.append(entry)
            except FileNotFoundError:
                pass
    return removed


def local_device_index(uuid: str) -> int:
    """This process's index of the GPU whose UUID is `uuid`."""
    torch = _torch()
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == uuid:
            return index
    raise RuntimeError(f"the GPU {uuid} of a cuda_ipc pool is not visible in this process")


class CudaIpcWriter:
    """Producer side: owns the device pool (created on the first write) and its slots."""

    def __init__(self, owner: str, capacity_bytes: int, device: Any = None) -> None:
        self.segment = unique_segment_name(owner, "cuda")
        self._slots = SlotAllocator(capacity_bytes)
        self.capacity = self._slots.capacity
        self._device = device
        self._pool: Any = None
        self._events: list[Any] = []
        self._copy_stream: Any = None  # host sources' copies into the pool (made on first use)
        self._lock = threading.Lock()
        self._finalizer: weakref.finalize | None = None
        self._closed = False

    def _open_pool(self, like: Any) -> None:
        """Allocate the pool, make the event ring and publish their IPC handles once."""
        torch = _torch()
        if not torch.cuda.is_available():
            raise RuntimeError("the cuda_ipc channel needs a CUDA GPU; use the shm channel for CPU tensors")
        device = torch.device(self._device) if self._device is not None else like.device
        if device.type != "cuda" or device.index is None:
            device = torch.device("cuda", device.index if device.type == "cuda" else torch.cuda.current_device())
        with torch.cuda.device(device):
            pool = torch.empty(self.capacity, dtype=torch.uint8, device=device)
            events = [torch.cuda.Event(interprocess=True) for _ in range(EVENT_RING)]
            info = {
                "pid": os.getpid(),
                "uuid": str(torch.cuda.get_device_properties(device).uuid),
                "capacity": self.capacity,
                "share": _to_json(pool.untyped_storage()._share_cuda_()),
                "events": [e.ipc_handle().hex() for e in events],
            }
        path = segment_path(self.segment)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, json.dumps(info).encode())
        finally:
            os.close(fd)
        self._finalizer = weakref.finalize(self, unlink_if_creator, path, os.getpid())
        self._pool, self._events = pool, events
        _LOCAL_WRITERS[self.segment] = self

    def write(self, name: str, array: Any) -> tuple[PayloadDesc, list[Any]]:
        torch = _torch()
        if self._closed:
            raise RuntimeError(f"cuda_ipc writer {self.segment} is closed")
        if isinstance(array, torch.Tensor):
            tensor = array.detach()
        else:  # as_numpy makes 0-d arrays 1-d: give them their shape back
            tensor = torch.from_numpy(as_numpy(array)[0].reshape(np.shape(array)))
        with self._lock:
            if self._pool is None:
                self._open_pool(tensor)
        nbytes = tensor.numel() * tensor.element_size()
        dtype = str(tensor.dtype).removeprefix("torch.")
        desc = PayloadDesc(name=name, channel="cuda_ipc", dtype=dtype, shape=list(tensor.shape), segment=self.segment, nbytes=nbytes)
        if nbytes == 0:
            return desc, []
        got = self._slots.alloc(nbytes)  # ValueError if it could never fit
        if got is None:
            raise ChannelFull(
                f"cuda_ipc pool {self.segment}: no room for {nbytes} bytes "
                f"({self._slots.used} of {self.capacity} in use, largest free block {self._slots.largest_free()})"
            )
        token, offset = got
        event_index = token % EVENT_RING
        src = tensor.contiguous().reshape(-1).view(torch.uint8)
        with torch.cuda.device(self._pool.device):
            if src.is_cuda:
                self._pool[offset : offset + nbytes].copy_(src, non_blocking=True)
                self._events[event_index].record()
            else:  # staged in pinned memory (the caller may reuse its own at once), copied on a stream of
                # the writer's: a blocking copy would wait for every kernel queued on the compute stream
                # (a decode step launched ahead, omni/stages/ar/lookahead.py)
                staged = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).copy_(src)
                stream = self._copy_stream = self._copy_stream or torch.cuda.Stream(self._pool.device)
                with torch.cuda.stream(stream):
                    self._pool[offset : offset + nbytes].copy_(staged, non_blocking=True)
                    self._events[event_index].record(stream)
        desc.offset = offset
        desc.extra = _EXTRA.pack(token, event_index)
        return desc, []

    def free(self, token: int) -> bool:
        """Take a slot back; False if `token` is not live (a stale credit after `free_all`)."""
        return self._slots.free(token)

    def free_all(self) -> None:
        self._slots.reset()

    def stats(self) -> dict[str, int]:
        return {"capacity": self.capacity, "used": self._slots.used, "live": self._slots.live, "largest_free": self._slots.largest_free()}

    def close(self) -> None:
        """Drop the pool and unlink the sidecar (torch keeps the memory while consumers map it)."""
        if self._closed:
            return
        self._closed = True
        _LOCAL_WRITERS.pop(self.segment, None)
        self._pool, self._events = None, []
        if self._finalizer is not None:
            self._finalizer()


class _OpenedPool:
    """One producer's pool as this process sees it: a uint8 tensor over the whole pool + events."""

    def __init__(self, segment: str) -> None:
        torch = _torch()
        try:
            with open(segment_path(segment), "rb") as f:
                info = json.loads(f.read())
        except FileNotFoundError:
            raise FileNotFoundError(f"cuda_ipc pool {segment!r} does not exist (did its producer exit?)") from None
        self.capacity = int(info["capacity"])
        local = _LOCAL_WRITERS.get(segment) if info["pid"] == os.getpid() else None
        if local is not None:  # same process: CUDA cannot open its own IPC handles; use the pool itself
            self.device, self.tensor = local._pool.device, local._pool
            self._events = dict(enumerate(local._events))
            self._handles: list[bytes] = []
            return
        self.device = torch.device("cuda", local_device_index(info["uuid"]))
        share = _from_json(info["share"])
        share[0] = self.device.index
        torch.cuda._lazy_init()
        storage = torch.UntypedStorage._new_shared_cuda(*share)
        self.tensor = torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage, 0, (self.capacity,), (1,))
        self._handles = [bytes.fromhex(h) for h in info["events"]]
        self._events: dict[int, Any] = {}

    def event(self, index: int) -> Any:
        event = self._events.get(index)
        if event is None:
            if not 0 <= index < len(self._handles):
                raise ValueError(f"event index {index} out of range in a cuda_ipc descriptor")
            event = _torch().cuda.Event.from_ipc_handle(self.device, self._handles[index])
            self._events[index] = event
        return event


def copy_to_device(view: Any, device: Any) -> Any:
    """`view` (on the pool's GPU) copied onto `device`, queued on the pool GPU's current stream."""
    torch = _torch()
    out = torch.empty(view.shape, dtype=view.dtype, device=device)
    out.copy_(view, non_blocking=True)
    return out


class StreamMark:
    """CUDA events recorded on a consumer's streams (`CudaIpcReader.mark`)."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events

    def done(self) -> bool:
        return all(e.query() for e in self.events)

    def wait(self) -> None:
        for e in self.events:
            e.synchronize()


class CudaIpcReader:
    """Consumer side: opens each producer's pool once and hands out views into it (or, when the
    consumer's `device` is another GPU, copies onto that GPU)."""

    def __init__(self, device: Any = None) -> None:
        self._pools: dict[str, _OpenedPool] = {}
        self.device = device  # the consumer's device; None or a non-cuda one: views as they are
        self.copies = 0  # reads copied from another GPU's pool
        self.peer: dict[tuple[int, int], bool] = {}  # (pool GPU, consumer GPU) -> peer access possible

    def _target(self, pool: _OpenedPool) -> Any:
        """The consumer's GPU when it is not the pool's, else None (the view is handed out)."""
        if self.device is None or not str(self.device).startswith("cuda"):
            return None
        torch = _torch()
        target = torch.device(self.device)
        if target.index is None:
            target = torch.device("cuda", torch.cuda.current_device())
        if target == pool.device:
            return None
        key = (pool.device.index, target.index)
        if key not in self.peer:
            self.peer[key] = bool(torch.cuda.can_device_access_peer(target.index, pool.device.index))
        return target

    def _open(self, segment: str) -> _OpenedPool:
        check_name(segment)
        for name in [n for n in self._pools if not os.path.exists(segment_path(n))]:
            del self._pools[name]  # its producer is gone: let the mapping go
        self._pools[segment] = _OpenedPool(segment)
        return self._pools[segment]

    def read(self, desc: PayloadDesc, frames: list[Any]) -> Any:
        torch = _torch()
        pool = self._pools.get(desc.segment) or self._open(desc.segment)
        dtype = torch_dtype(desc.dtype)
        if desc.nbytes == 0:
            return torch.empty(desc.shape, dtype=dtype, device=self._target(pool) or pool.device)
        if desc.offset < 0 or desc.offset + desc.nbytes > pool.capacity or len(desc.extra) != _EXTRA.size:
            raise ValueError(f"bad cuda_ipc descriptor for {desc.name!r} in pool {desc.segment} ({pool.capacity} bytes)")
        _, event_index = _EXTRA.unpack(desc.extra)
        event = pool.event(event_index)
        if not event.query():  # a stream waiting on an IPC event costs ~160 us even when it is done
            torch.cuda.current_stream(pool.device).wait_event(event)
        view = pool.tensor[desc.offset : desc.offset + desc.nbytes].view(dtype).view(desc.shape)
        target = self._target(pool)
        if target is None:
            return view
        self.copies += 1
        with torch.cuda.device(pool.device):  # torch queues a cross-GPU copy on the source's stream
            return copy_to_device(view, target)

    def token(self, desc: PayloadDesc) -> int | None:
        return _EXTRA.unpack(desc.extra)[0] if len(desc.extra) == _EXTRA.size else None

    def fence(self) -> None:
        """Block until work queued so far on the current streams has finished (before credits)."""
        self.mark().wait()

    def mark(self) -> "StreamMark":
        """The point reached by work queued so far on the current streams: credits for the views read
        until now go back once it is `done()`, without blocking on kernels queued ahead of it."""
        torch = _torch()
        events = []
        for device in {pool.device for pool in self._pools.values()}:
            events.append(torch.cuda.Event())
            events[-1].record(torch.cuda.current_stream(device))
        return StreamMark(events)

    def pool_range(self, segment: str) -> tuple[int, int]:
        """(device pointer, bytes) of an opened pool (diagnostics and zero-copy tests)."""
        pool = self._pools[segment]
        return pool.tensor.data_ptr(), pool.capacity

    @property
    def segments(self) -> list[str]:
        return list(self._pools)

    def close(self) -> None:
        self._pools.clear()


class CudaIpcChannel:
    """Same-host GPU tensors: one copy into the producer's pool, zero copies out."""

    name = "cuda_ipc"

    @staticmethod
    def writer(owner: str, capacity_bytes: int = 0, device: Any = None) -> CudaIpcWriter:
        """`capacity_bytes` 0 means DEFAULT_CAPACITY; `device` None means the first tensor's GPU."""
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        check_name(owner, "owner")
        return CudaIpcWriter(owner, capacity_bytes or DEFAULT_CAPACITY, device)

    @staticmethod
    def reader(device: Any = None) -> CudaIpcReader:
        return CudaIpcReader(device)
