"""The payload-channel contract the actor speaks, and the lookup of channels by name.

Channels live in `omni.transport` (a higher layer that may import torch); the kernel only
knows this contract and loads an implementation by name, like a plugin.

Producer side: `writer.write(name, array) -> (PayloadDesc, frames)` places one array
(raising `ChannelFull` when its arena has no room: the actor then waits for credits) and
`writer.free(token)` takes a slot back when the consumer's credit names it.
Consumer side: `reader.read(desc, frames) -> array` gives a view that stays valid until
the consumer returns `reader.token(desc)` in a credit.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from omni.kernel.messages import PayloadDesc


class ChannelFull(Exception):
    """The producer's arena has no room now; retry after a credit frees slots."""


class ChannelWriter(Protocol):
    def write(self, name: str, array: Any) -> tuple[PayloadDesc, list[Any]]: ...
    def free(self, token: int) -> None: ...
    def close(self) -> None: ...


class ChannelReader(Protocol):
    def read(self, desc: PayloadDesc, frames: list[Any]) -> Any: ...
    def token(self, desc: PayloadDesc) -> int | None: ...
    def close(self) -> None: ...


CHANNELS: dict[str, str] = {
    "inline": "omni.transport.inline:InlineChannel",
    "shm": "omni.transport.shm:ShmChannel",
    "cuda_ipc": "omni.transport.cuda_ipc:CudaIpcChannel",
}


# Per-channel clean-up of what a dead process leaves outside its owner prefix (CUDA driver files).
PROCESS_CLEANUP: dict[str, str] = {
    "cuda_ipc": "omni.transport.cuda_ipc:unlink_process_leftovers",
}


def cleanup_dead_process(channels: set[str], pid: int) -> None:
    """Run the clean-up hook of every channel in use for a process that has exited."""
    for name in channels & set(PROCESS_CLEANUP):
        module, _, attr = PROCESS_CLEANUP[name].partition(":")
        try:
            getattr(importlib.import_module(module), attr)(pid)
        except Exception:  # clean-up is best effort; never let it break supervision
            pass


def load_channel(name: str) -> Any:
    """Return the channel class registered under `name` (it has `writer(...)` and `reader()`)."""
    try:
        target = CHANNELS[name]
    except KeyError:
        raise ValueError(f"unknown payload channel {name!r}; known: {sorted(CHANNELS)}") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def is_array(value: Any) -> bool:
    """True for numpy arrays and tensors (anything with an array interface), without torch."""
    return (
        hasattr(value, "__array_interface__")
        or hasattr(value, "__cuda_array_interface__")
        or type(value).__module__.startswith("torch")
    )
