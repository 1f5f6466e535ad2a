"""What every payload channel with slots promises, checked on shm and on the network channel alike:
round trips of every dtype and shape through the bus's encoding and real zmq frames (over TCP for
the network channel), into a spawned process too; bounded bytes with ChannelFull until a credit
frees a slot; a payload larger than the whole capacity refused; stale tokens ignored; bad input
refused. (cuda_ipc's own tests: tests/test_transport_cuda_ipc.py, on a GPU.)"""

from __future__ import annotations

import multiprocessing as mp
import uuid

import numpy as np
import pytest
import zmq

from omni.transport.channels import ChannelFull, load_channel
from omni.kernel.errors import PayloadTooLarge
from omni.kernel.messages import RequestChunk, decode, encode
from omni.transport.shm import unlink_prefix
from test_transport_shm import _digest, _same, _samples

CHANNELS = ["shm", "network"]


@pytest.fixture(params=CHANNELS)
def channel(request):
    owner = f"omni-test-{uuid.uuid4().hex[:10]}"
    yield request.param, load_channel(request.param), owner
    unlink_prefix(owner)


@pytest.fixture
def pair():
    """A PUSH/PULL pair over TCP on loopback: what the bus between two hosts is."""
    ctx = zmq.Context.instance()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind("tcp://127.0.0.1:*")
    push.connect(pull.getsockopt_string(zmq.LAST_ENDPOINT))
    yield push, pull
    push.close(0)
    pull.close(0)


def _send(push, pull, descs, frames):
    push.send_multipart([encode(RequestChunk("r", 0, payloads=descs)), *frames], copy=False)
    got = pull.recv_multipart(copy=False)
    return decode(got[0].buffer).payloads, got[1:]


def _write_all(writer, samples):
    descs, frames = [], []
    for name, value in samples.items():
        desc, extra = writer.write(name, value)
        if extra:
            desc.frame = len(frames)
            frames.extend(extra)
        descs.append(desc)
    return descs, frames


def test_round_trip_every_dtype_and_shape_over_the_wire(channel, pair):
    name, cls, owner = channel
    writer, reader = cls.writer(owner, 1 << 20), cls.reader()
    samples = _samples()
    descs, got_frames = _send(*pair, *_write_all(writer, samples))
    for desc in descs:
        assert desc.channel == name
        assert _same(reader.read(desc, got_frames), samples[desc.name]), desc.name
        token = reader.token(desc)
        assert (token is None) == (desc.nbytes == 0)
        if token is not None:
            assert writer.free(token)
    assert writer.stats()["used"] == 0
    reader.close()
    writer.close()


def _child(name: str, address: str, conn) -> None:
    import zmq

    from omni.transport.channels import load_channel
    from omni.kernel.messages import decode

    reader = load_channel(name).reader()
    sock = zmq.Context.instance().socket(zmq.PULL)
    sock.connect(address)
    frames = sock.recv_multipart(copy=False)
    descs = decode(frames[0].buffer).payloads
    conn.send([(d.name, _digest(reader.read(d, frames[1:])), reader.token(d)) for d in descs])
    reader.close()


def test_round_trip_into_a_spawned_process(channel):
    name, cls, owner = channel
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.bind("tcp://127.0.0.1:*")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(name, push.getsockopt_string(zmq.LAST_ENDPOINT), child), daemon=True)
    proc.start()
    writer = cls.writer(owner, 1 << 20)
    try:
        samples = _samples()
        descs, frames = _write_all(writer, samples)
        push.send_multipart([encode(RequestChunk("r", 0, payloads=descs)), *frames], copy=False)
        assert parent.poll(60), "child did not answer"
        for key, digest, token in parent.recv():
            assert digest == _digest(samples[key]), key
            if token is not None:
                assert writer.free(token)
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
        push.close(0)
        writer.close()


def test_full_until_a_credit_frees_a_slot(channel):
    _, cls, owner = channel
    writer, reader = cls.writer(owner, 1 << 16), cls.reader()
    block = np.ones(16 << 10, dtype=np.uint8)
    descs = [writer.write(f"b{i}", block)[0] for i in range(4)]
    with pytest.raises(ChannelFull):
        writer.write("more", block)
    assert writer.free(reader.token(descs[2]))
    assert not writer.free(reader.token(descs[2]))  # a second credit for one slot changes nothing
    writer.write("more", block)
    writer.free_all()
    assert writer.stats()["used"] == 0 and not writer.free(reader.token(descs[0]))  # stale after free_all
    reader.close()
    writer.close()


def test_a_payload_larger_than_the_capacity_is_refused(channel):
    _, cls, owner = channel
    writer = cls.writer(owner, 1 << 16)
    with pytest.raises(PayloadTooLarge, match="exceeds the whole arena"):
        writer.write("huge", np.zeros((1 << 16) + 1, dtype=np.uint8))
    writer.write("fits", np.zeros(1 << 16, dtype=np.uint8))
    writer.close()


def test_bad_input_is_refused(channel):
    _, cls, owner = channel
    with pytest.raises(ValueError):
        cls.writer(owner, -1)
    writer = cls.writer(owner, 1 << 16)
    with pytest.raises(TypeError):
        writer.write("objects", np.array([object()]))
    writer.close()
    with pytest.raises(RuntimeError):
        writer.write("after_close", np.arange(4))


def test_network_frames_that_disagree_with_their_descriptor_are_refused(pair):
    cls = load_channel("network")
    writer, reader = cls.writer("", 1 << 16), cls.reader()
    desc, frames = writer.write("x", np.arange(8, dtype=np.int64))
    desc.frame = 0
    with pytest.raises(ValueError, match="frame"):
        reader.read(desc, [])
    with pytest.raises(ValueError, match="bytes"):
        reader.read(desc, [b"\0" * 8])
    assert np.array_equal(reader.read(desc, frames), np.arange(8))


def test_rdma_transports_are_refused_clearly(monkeypatch):
    monkeypatch.setenv("OMNI_NETWORK_TRANSPORT", "nixl")
    with pytest.raises(RuntimeError, match="nixl.*only zmq"):
        load_channel("network").writer("", 1 << 16)
    monkeypatch.setenv("OMNI_NETWORK_TRANSPORT", "carrier-pigeon")
    with pytest.raises(ValueError, match="zmq, nixl, mooncake"):
        load_channel("network").reader()
