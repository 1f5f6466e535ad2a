"""The shm channel: a producer-owned arena in /dev/shm that each consumer maps once.

One write is one memcpy into a slot of the producer's segment; the descriptor says where the
array lies (segment, offset, nbytes, dtype, shape) and a read is a zero-copy view of the mapping.
A slot belongs to the consumer until the credit carrying `reader.token(desc)` comes back.

Segments are plain files in /dev/shm opened with os.open + mmap (no multiprocessing resource
tracker, which unlinks segments it did not create). Every segment name starts with the writer's
`owner`, so `unlink_prefix(owner)` removes whatever a dead process left behind. The whole
capacity is reserved with posix_fallocate when the arena is created: a full /dev/shm fails then,
with a clear error, instead of killing the producer with SIGBUS on some later write.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import secrets
import weakref
from typing import Any

import numpy as np

from omni.transport.channels import ChannelFull
from omni.kernel.messages import PayloadDesc
from omni.transport.arena import SlotAllocator
from omni.transport.arrays import as_numpy, from_buffer

SHM_DIR = "/dev/shm"
DEFAULT_CAPACITY = 64 << 20
_NAME_OK = re.compile(r"[A-Za-z0-9._-]{1,200}")
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def check_name(name: str, what: str = "segment name") -> str:
    """Segment names and owners are single file names in /dev/shm: letters, digits, '.', '_', '-'."""
    if not isinstance(name, str) or not _NAME_OK.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"invalid {what} {name!r}: use 1-200 of [A-Za-z0-9._-]")
    return name


def segment_path(name: str) -> str:
    return os.path.join(SHM_DIR, check_name(name))


def unique_segment_name(owner: str, kind: str) -> str:
    """`<owner>-<kind>-<pid>-<random>`: starts with the owner, never collides with a restart's."""
    return f"{check_name(owner, 'owner')}-{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def create_segment(name: str, size: int) -> mmap.mmap:
    """Create /dev/shm/<name> of `size` bytes, reserve its memory and map it read-write."""
    path = segment_path(name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise OSError(
                    exc.errno,
                    f"cannot reserve {size} bytes in {SHM_DIR} for {name}: {exc.strerror} "
                    "(lower capacity_bytes or give the container a larger --shm-size)",
                ) from exc
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)


def open_segment(name: str) -> mmap.mmap:
    """Map an existing segment read-write (so tensors built on views need no copy or warning)."""
    try:
        fd = os.open(segment_path(name), os.O_RDWR)
    except FileNotFoundError:
        raise FileNotFoundError(f"shm segment {name!r} does not exist (did its producer exit?)") from None
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_SHARED | _POPULATE)
    finally:
        os.close(fd)


def unlink_prefix(prefix: str) -> list[str]:
    """Remove every /dev/shm entry whose name starts with `prefix`; returns the names removed.

    Pass the owner plus its separator (e.g. "omni-ab12-talker-0-") so replica 1 does not also
    match replica 10.
    """
    check_name(prefix, "prefix")
    removed = []
    for entry in sorted(os.listdir(SHM_DIR)):
        if entry.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, entry))
                removed.append(entry)
            except FileNotFoundError:
                pass
    return removed


def unlink_if_creator(path: str, creator_pid: int) -> None:
    """Finalizer: only the creating process unlinks (a forked child must not)."""
    if os.getpid() == creator_pid:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _close_quietly(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        pass  # a caller still holds a view; the mapping goes away when the last view does


def token_bytes(token: int) -> bytes:
    return token.to_bytes(8, "little")


def token_of(desc: PayloadDesc) -> int | None:
    """The slot token a writer put in `desc.extra` (None for arrays that took no slot)."""
    return int.from_bytes(desc.extra[:8], "little") if desc.extra else None


def _flat_bytes(array: Any) -> tuple[np.ndarray, str, list[int]]:
    """A flat uint8 view of `array`'s bytes, its dtype name and its shape."""
    arr, dtype = as_numpy(array)
    if arr.ndim == 1 and np.ndim(array) == 0:
        arr = arr.reshape(())  # np.ascontiguousarray turns 0-d arrays into 1-d ones
    if arr.dtype.hasobject or arr.dtype.fields is not None:
        raise TypeError(f"cannot place dtype {arr.dtype} in shared memory: plain numeric dtypes only")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr.reshape(-1).view(np.uint8), dtype, list(arr.shape)


class ShmWriter:
    """Producer side: owns one segment and the allocator of its slots."""

    def __init__(self, owner: str, capacity_bytes: int) -> None:
        page = mmap.PAGESIZE
        self.capacity = -(-capacity_bytes // page) * page
        self.segment = unique_segment_name(owner, "shm")
        self._mm: mmap.mmap | None = create_segment(self.segment, self.capacity)
        self._finalizer = weakref.finalize(self, unlink_if_creator, segment_path(self.segment), os.getpid())
        self._bytes = np.frombuffer(self._mm, dtype=np.uint8)
        self._slots = SlotAllocator(self.capacity)

    def write(self, name: str, array: Any) -> tuple[PayloadDesc, list[Any]]:
        if self._mm is None:
            raise RuntimeError(f"shm writer {self.segment} is closed")
        flat, dtype, shape = _flat_bytes(array)
        desc = PayloadDesc(name=name, channel="shm", dtype=dtype, shape=shape, segment=self.segment, nbytes=flat.size)
        if flat.size == 0:
            return desc, []  # empty arrays take no slot and need no credit
        got = self._slots.alloc(flat.size)  # ValueError if it could never fit
        if got is None:
            raise ChannelFull(
                f"shm arena {self.segment}: no room for {flat.size} bytes "
                f"({self._slots.used} of {self.capacity} in use, largest free block {self._slots.largest_free()})"
            )
        token, offset = got
        np.copyto(self._bytes[offset : offset + flat.size], flat)
        desc.offset = offset
        desc.extra = token_bytes(token)
        return desc, []

    def free(self, token: int) -> bool:
        """Take a slot back; False if `token` is not live (a stale credit after `free_all`)."""
        return self._slots.free(token)

    def free_all(self) -> None:
        """Every slot is free again (the consumer restarted, so it holds no views any more)."""
        self._slots.reset()

    def stats(self) -> dict[str, int]:
        return {
            "capacity": self.capacity,
            "used": self._slots.used,
            "live": self._slots.live,
            "largest_free": self._slots.largest_free(),
        }

    def close(self) -> None:
        """Unmap and unlink the segment (readers' existing mappings stay valid until they close)."""
        if self._mm is None:
            return
        self._bytes = None
        _close_quietly(self._mm)
        self._mm = None
        self._finalizer()

    def __enter__(self) -> ShmWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ShmReader:
    """Consumer side: maps each producer's segment once and hands out views into it."""

    def __init__(self) -> None:
        self._maps: dict[str, tuple[mmap.mmap, memoryview]] = {}

    def read(self, desc: PayloadDesc, frames: list[Any]) -> Any:
        if desc.nbytes == 0:
            return from_buffer(bytearray(), desc.dtype, desc.shape)
        mapped = self._maps.get(desc.segment) or self._open(desc.segment)
        view = mapped[1]
        if desc.offset < 0 or desc.offset + desc.nbytes > len(view):
            raise ValueError(
                f"payload {desc.name!r} [{desc.offset}, {desc.offset + desc.nbytes}) "
                f"lies outside segment {desc.segment} ({len(view)} bytes)"
            )
        return from_buffer(view[desc.offset : desc.offset + desc.nbytes], desc.dtype, desc.shape)

    def token(self, desc: PayloadDesc) -> int | None:
        return token_of(desc)

    def _open(self, segment: str) -> tuple[mmap.mmap, memoryview]:
        for name in [n for n in self._maps if not os.path.exists(segment_path(n))]:
            self._drop(name)  # its producer is gone: let the memory go
        mm = open_segment(segment)
        self._maps[segment] = (mm, memoryview(mm))
        return self._maps[segment]

    def _drop(self, segment: str) -> None:
        mm, view = self._maps.pop(segment)
        view.release()
        _close_quietly(mm)

    @property
    def segments(self) -> list[str]:
        return list(self._maps)

    def close(self) -> None:
        for name in list(self._maps):
            self._drop(name)


class ShmChannel:
    """Same-host CPU arrays: one copy into shared memory, zero copies out."""

    name = "shm"

    @staticmethod
    def writer(owner: str, capacity_bytes: int = 0) -> ShmWriter:
        """`capacity_bytes` 0 means DEFAULT_CAPACITY (64 MiB)."""
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        return ShmWriter(owner, capacity_bytes or DEFAULT_CAPACITY)

    @staticmethod
    def reader() -> ShmReader:
        return ShmReader()
