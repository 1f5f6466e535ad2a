"""The payload-channel contract the kernel's actors speak, the lookup of channels by name, and the
choice of a channel per edge: how arrays cross an edge, so it lives with the channels, not in the
kernel. The implementations (which may import torch) are loaded by name, like plugins.

Producer side: `writer.write(name, array) -> (PayloadDesc, frames)` places one array
(raising `ChannelFull` when its arena has no room: the actor then waits for credits) and
`writer.free(token)` takes a slot back when the consumer's credit names it.
Consumer side: `reader.read(desc, frames) -> array` gives a view that stays valid until
the consumer returns `reader.token(desc)` in a credit; a reader may have `mark()`, which the
consumer's compute thread calls after a step: the step's credits go back once the mark is `done()`
(GPU reads must finish first; the host does not wait for them while it has work).
"""

from __future__ import annotations

from typing import Any

from omni.kernel.graph import OUT, EdgeSpec, Graph
from omni.kernel.messages import PayloadDesc, RequestChunk
from omni.kernel.registry import resolve

INLINE_MAX_BYTES = 16 << 10  # smaller arrays ride as zmq frames whatever an "auto" edge's channel
CHANNELS: dict[str, str] = {
    "inline": "omni.transport.inline:InlineChannel",
    "shm": "omni.transport.shm:ShmChannel",
    "cuda_ipc": "omni.transport.cuda_ipc:CudaIpcChannel",
    "network": "omni.transport.network:NetworkChannel",  # across hosts (the actor picks it by placement)
}

# What a process that exited leaves in /dev/shm: the segments of every channel, named by their
# owner's prefix, and for some channels files named by its pid (the CUDA driver's).
UNLINK_OWNED = "omni.transport.shm:unlink_prefix"
PROCESS_CLEANUP: dict[str, str] = {
    "cuda_ipc": "omni.transport.cuda_ipc:unlink_process_leftovers",
}


class ChannelFull(Exception):
    """The producer's arena has no room now; retry after a credit frees slots."""


def load_channel(name: str) -> Any:
    """Return the channel class registered under `name` (it has `writer(...)` and `reader()`)."""
    if name not in CHANNELS:
        raise ValueError(f"unknown payload channel {name!r}; known: {sorted(CHANNELS)}")
    return resolve(CHANNELS[name])


def channel_of(graph: Graph, edge: EdgeSpec) -> str:
    """The channel an edge uses between ends on one host: forced by the graph, else chosen from placement."""
    if edge.channel != "auto":
        return edge.channel
    if edge.dst == OUT:
        return "inline"
    if all(d.startswith("cuda") for d in graph.stage(edge.src).all_devices() + graph.stage(edge.dst).all_devices()):
        return "cuda_ipc"
    return "shm"


def release_leftovers(graph: Graph, owner: str, pid: int = 0) -> None:
    """Remove what exited processes left in /dev/shm: the segments named `owner...` and, for the
    process `pid`, the files that channels of the graph leave named by its pid. Best effort: it
    never breaks supervision."""
    calls = [(UNLINK_OWNED, owner)]
    if pid:
        calls += [(PROCESS_CLEANUP[c], pid) for c in {channel_of(graph, e) for e in graph.edges} & set(PROCESS_CLEANUP)]
    for target, arg in calls:
        try:
            resolve(target)(arg)
        except Exception:
            pass


class Readers:
    """The consumer side of every channel one process reads from, each opened on first use."""

    def __init__(self, device: str | None = None) -> None:
        self._open: dict[str, Any] = {}
        self.mark: Any = None  # the mark() of a reader that has one (cuda_ipc)
        self.device = device  # this replica's device: cuda_ipc copies tensors of another GPU's pool there

    def get(self, channel: str) -> Any:
        if channel not in self._open:
            reader = self._open[channel] = load_channel(channel).reader()
            if hasattr(reader, "device"):
                reader.device = self.device
            self.mark = getattr(reader, "mark", self.mark)
        return self._open[channel]

    def token(self, desc: PayloadDesc) -> int | None:
        """The slot `desc` holds in its producer's arena (None: it holds none, e.g. inline)."""
        return self.get(desc.channel).token(desc)

    def read(self, msg: RequestChunk, frames: list[Any]) -> tuple[dict[str, Any], list[int]]:
        """A chunk's values (arrays as views into the channel) and the slot tokens to credit back."""
        data = dict(msg.meta)
        for desc in msg.payloads:
            data[desc.name] = self.get(desc.channel).read(desc, frames)
        return data, [t for t in map(self.token, msg.payloads) if t is not None]

    def close(self) -> None:
        for reader in self._open.values():
            reader.close()


class Writers:
    """The producer side of every channel one replica writes to, each opened on first use."""

    def __init__(self, graph: Graph, owner: str, arena_bytes: int) -> None:
        self.graph, self.owner, self.arena_bytes = graph, owner, arena_bytes
        self._open: dict[str, Any] = {}

    def get(self, channel: str) -> Any:
        if channel not in self._open:
            self._open[channel] = load_channel(channel).writer(self.owner, self.arena_bytes)
        return self._open[channel]

    def write(self, edge: EdgeSpec, channel: str, key: str, value: Any) -> tuple[PayloadDesc, list[Any]]:
        """One array on `channel` (the link's: by where the consumer was placed; a small one inline
        on an "auto" shm or network edge); raises ChannelFull when the arena has no room now,
        PayloadTooLarge when it never will."""
        if edge.channel == "auto" and channel in ("shm", "network") and getattr(value, "nbytes", 0) <= INLINE_MAX_BYTES:
            channel = "inline"
        return self.get(channel).write(key, value)

    def free(self, channel: str, token: int) -> None:
        """Take back a payload slot of `channel` (its consumer credited it, or is gone)."""
        self.get(channel).free(token)

    def close(self) -> None:
        for writer in self._open.values():
            writer.close()
