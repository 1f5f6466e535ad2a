"""Every message of the control bus, as one msgspec tagged union.

Bulk data never rides inside a message: a `RequestChunk` carries `PayloadDesc` handles and the
bytes travel as extra zmq frames (inline) or stay in a shared arena (shm, cuda_ipc). An edge is
named by its id, its index in `Graph.edges`. New fields are appended with defaults so old peers
still decode.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from omni.sampling import Sampling


class PayloadDesc(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Where one array of a chunk lives. Channels fill the fields they need."""
    name: str
    channel: str
    dtype: str
    shape: list[int]
    frame: int = -1  # inline: index of the extra zmq frame
    segment: str = ""  # shm / cuda_ipc: arena name
    offset: int = 0
    nbytes: int = 0
    extra: bytes = b""  # channel specific (e.g. a CUDA IPC event handle)


class Msg(msgspec.Struct, tag_field="op", tag=str.lower, omit_defaults=True):
    """Base of the tagged union; the tag is the lower-cased class name."""


class RequestOpen(Msg, gc=False):
    """A request starts: its parameters, and its sampling typed, keyed by the stage it is for."""
    rid: str
    params: dict[str, Any] = {}
    skip: list[str] = []  # stages this request never enters (routing.py): no edge into them opens
    sampling: dict[str, Sampling] = {}
    replicas: dict[str, int] = {}  # stage -> the replica serving the request there (routing.py); absent: 0


class RequestChunk(Msg, gc=False):
    """One item of a request's stream on an edge: small values in `meta`, arrays by handle. With `rows`,
    one item each of several requests (rid = rows[0]): row i of every array is rows[i]'s, `meta` each's."""
    rid: str
    edge: int
    meta: dict[str, Any] = {}
    payloads: list[PayloadDesc] = []
    rows: list[str] = []
    src: int = 0  # the sending replica of the edge's source stage: the credit goes back to it


class RequestEnd(Msg, gc=False):
    """The request's stream on `edge` is complete (-1: the client's, into the entry stage)."""
    rid: str
    edge: int
    meta: dict[str, Any] = {}


class RequestError(Msg, gc=False):
    """A stage failed the request; the kernel ends it for the client and cancels it elsewhere."""
    rid: str
    stage: str
    kind: str
    message: str


class RequestLeft(Msg, gc=False):
    """A stage is done with `rid`: it holds nothing for it and sends it nothing more (to the kernel,
    so a death of that stage later fails only the requests still in it)."""
    rid: str
    stage: str


class RequestCancel(Msg, gc=False):
    """Free every piece of state held for `rid`."""
    rid: str


class EdgeCredit(Msg, gc=False):
    """The `consumer` replica took one chunk of `edge`; `tokens` name the payload slots it frees."""
    edge: int
    consumer: str
    tokens: list[int] = []


class ActorReady(Msg):
    """A replica is set up and serving; across hosts its mailbox's TCP address and its node."""
    stage: str
    replica: int
    pid: int
    address: str = ""
    node: str = ""


class ActorFailed(Msg):
    """Sent instead of ActorReady when set-up raised."""
    stage: str
    replica: int
    error: str


class ActorHeartbeat(Msg, gc=False):
    """Every half second; a replica that stops sending them is killed as stalled."""
    stage: str
    replica: int
    stats: dict[str, Any] = {}


class StatsQuery(Msg):
    token: int


class StatsReply(Msg):
    token: int
    stage: str
    replica: int
    stats: dict[str, Any] = {}


class PeerUpdate(Msg):
    """A replica (re)started: forget what it held and reconnect to it (at `address`, on `node`, across hosts)."""
    stage: str
    replica: int
    address: str = ""
    node: str = ""


class ActorShutdown(Msg):
    """Finish cleanly: the kernel is stopping."""


AnyMsg = Union[
    RequestOpen, RequestChunk, RequestEnd, RequestError, RequestLeft, RequestCancel, EdgeCredit,
    ActorReady, ActorFailed, ActorHeartbeat, StatsQuery, StatsReply, PeerUpdate, ActorShutdown,
]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(AnyMsg)


def encode(msg: Msg) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes | memoryview) -> AnyMsg:
    """Decode one message; raises msgspec.DecodeError / ValidationError on garbage."""
    return _decoder.decode(data)
