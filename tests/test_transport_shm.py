"""The shm channel and its slot allocator: round trips (also across a spawned process), back
pressure, alignment, no overlapping slots, and nothing left behind in /dev/shm."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import random
import uuid

import numpy as np
import pytest
import torch

from omni.transport.channels import ChannelFull, load_channel
from omni.kernel.messages import PayloadDesc, decode, encode, RequestChunk
from omni.transport.arena import SlotAllocator
from omni.transport.shm import SHM_DIR, ShmChannel, unlink_prefix


def _leftovers(prefix: str) -> list[str]:
    return [e for e in os.listdir(SHM_DIR) if e.startswith(prefix)]


@pytest.fixture
def owner():
    prefix = f"omni-test-{uuid.uuid4().hex[:10]}"
    yield prefix
    unlink_prefix(prefix)


def _samples() -> dict[str, object]:
    rng = np.random.default_rng(0)
    return {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f64": rng.standard_normal(7),
        "f16": rng.standard_normal((2, 2, 3)).astype(np.float16),
        "i8": rng.integers(-128, 127, 33, dtype=np.int8),
        "i16": rng.integers(-999, 999, (4, 4), dtype=np.int16),
        "i32": rng.integers(-(2**31), 2**31 - 1, 9, dtype=np.int32),
        "i64": rng.integers(-(2**62), 2**62, (2, 3), dtype=np.int64),
        "u8": rng.integers(0, 255, (1, 1, 65), dtype=np.uint8),
        "bool": rng.random(13) > 0.5,
        "c64": (rng.standard_normal(4) + 1j * rng.standard_normal(4)).astype(np.complex64),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "empty_bf16": torch.zeros(2, 0, dtype=torch.bfloat16),
        "strided": np.arange(24, dtype=np.int32).reshape(4, 6).T,
        "bigendian": np.arange(5, dtype=">i4"),
        "t_bf16": torch.randn(4, 8, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16),
        "t_f32": torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(2)),
        "t_i64": torch.arange(10).reshape(2, 5),
        "t_noncontig": torch.arange(12, dtype=torch.float32).reshape(3, 4)[:, ::2],
    }


def _same(got, want) -> bool:
    if isinstance(want, torch.Tensor):
        if want.dtype == torch.bfloat16:
            return isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
        want = want.numpy()
    got = got.numpy() if isinstance(got, torch.Tensor) else got
    return got.shape == want.shape and got.dtype == want.dtype.newbyteorder("=") and np.array_equal(got, want)


def _digest(array) -> str:
    if isinstance(array, torch.Tensor):
        array = array.contiguous()
        array = array.view(torch.int16) if array.dtype == torch.bfloat16 else array
        array = array.numpy()
    array = np.ascontiguousarray(array)
    array = array.astype(array.dtype.newbyteorder("="))
    return hashlib.sha256(array.tobytes()).hexdigest()


def test_channel_is_registered_under_its_name():
    assert load_channel("shm") is ShmChannel


def test_round_trip_many_dtypes_and_shapes(owner):
    writer, reader = ShmChannel.writer(owner, 1 << 20), ShmChannel.reader()
    try:
        for name, value in _samples().items():
            desc, frames = writer.write(name, value)
            assert frames == [] and desc.channel == "shm" and desc.segment.startswith(owner)
            desc = decode(encode(RequestChunk(rid="r", edge=0, payloads=[desc]))).payloads[0]
            got = reader.read(desc, frames)
            assert _same(got, value), name
            if desc.nbytes:
                assert writer.free(reader.token(desc))
            else:
                assert reader.token(desc) is None
        assert writer.stats()["used"] == 0
    finally:
        reader.close()
        writer.close()


def test_read_is_a_view_of_the_arena_not_a_copy(owner):
    writer, reader = ShmChannel.writer(owner, 1 << 16), ShmChannel.reader()
    desc, _ = writer.write("x", np.zeros(16, dtype=np.float32))
    first = reader.read(desc, [])
    np.asarray(writer._bytes[desc.offset : desc.offset + 4]).view(np.float32)[0] = 7.0
    assert first[0] == 7.0  # the consumer sees the producer's memory itself
    again = reader.read(desc, [])
    assert reader.segments == [desc.segment] and again[0] == 7.0  # mapped once
    del first, again
    reader.close()
    writer.close()


def _child_reads(conn) -> None:
    from omni.kernel.messages import decode
    from omni.transport.shm import ShmChannel

    reader = ShmChannel.reader()
    while (data := conn.recv_bytes()) != b"done":
        chunk = decode(data)
        arrays = [reader.read(d, []) for d in chunk.payloads]
        conn.send([(d.name, _digest(a), tuple(a.shape), str(a.dtype)) for d, a in zip(chunk.payloads, arrays)])
        conn.send([reader.token(d) for d in chunk.payloads])
    conn.send(reader.segments)
    reader.close()


def test_round_trip_across_a_spawned_process(owner):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child_reads, args=(child,), daemon=True)
    proc.start()
    writer = ShmChannel.writer(owner, 1 << 20)
    try:
        samples = _samples()
        for _ in range(2):  # the second batch reuses the slots the first one freed
            descs = [writer.write(name, value)[0] for name, value in samples.items()]
            parent.send_bytes(encode(RequestChunk(rid="r", edge=0, payloads=descs)))
            assert parent.poll(60), "child did not answer"
            for name, digest, shape, _dtype in parent.recv():
                assert digest == _digest(samples[name]), name
                assert shape == tuple(samples[name].shape), name
            for token in parent.recv():
                if token is not None:
                    assert writer.free(token)
        parent.send_bytes(b"done")
        assert parent.recv() == [writer.segment]
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
        writer.close()
    assert _leftovers(owner) == []


def test_channel_full_then_success_after_free(owner):
    writer = ShmChannel.writer(owner, 1 << 16)  # 64 KiB
    try:
        block = np.ones(16 << 10, dtype=np.uint8)
        descs = [writer.write(f"b{i}", block)[0] for i in range(4)]
        with pytest.raises(ChannelFull):
            writer.write("more", block)
        with pytest.raises(ChannelFull):
            writer.write("tiny", np.ones(1, dtype=np.uint8))
        reader = ShmChannel.reader()
        assert writer.free(reader.token(descs[2]))
        desc, _ = writer.write("more", block * 2)
        assert desc.offset == descs[2].offset
        assert int(reader.read(desc, []).sum()) == 2 * block.size
        assert int(reader.read(descs[3], []).sum()) == block.size  # its neighbour is intact
        reader.close()
    finally:
        writer.close()


def test_payload_bigger_than_the_arena_raises_value_error(owner):
    writer = ShmChannel.writer(owner, 1 << 16)
    with pytest.raises(ValueError, match="exceeds the whole arena"):
        writer.write("huge", np.zeros((1 << 16) + 1, dtype=np.uint8))
    writer.write("fits", np.zeros(1 << 16, dtype=np.uint8))  # exactly the capacity fits
    writer.close()


def test_slots_are_64_byte_aligned(owner):
    writer = ShmChannel.writer(owner, 1 << 16)
    offsets = [writer.write(f"a{n}", np.zeros(n, dtype=np.uint8))[0].offset for n in (1, 3, 63, 64, 65, 100, 7)]
    assert all(off % 64 == 0 for off in offsets)
    assert len(set(offsets)) == len(offsets)
    writer.close()


def test_free_all_returns_every_slot_and_ignores_stale_tokens(owner):
    writer, reader = ShmChannel.writer(owner, 1 << 16), ShmChannel.reader()
    old = [writer.write(f"x{i}", np.zeros(100, dtype=np.float32))[0] for i in range(5)]
    writer.free_all()
    assert writer.stats()["used"] == 0
    fresh, _ = writer.write("fresh", np.full(100, 9, dtype=np.float32))
    assert fresh.offset == old[0].offset
    assert not writer.free(reader.token(old[0]))  # a late credit from before the restart
    assert writer.stats()["live"] == 1 and float(reader.read(fresh, [])[0]) == 9.0
    reader.close()
    writer.close()


def test_close_and_unlink_prefix_leave_nothing(owner):
    writer = ShmChannel.writer(owner, 1 << 16)
    reader = ShmChannel.reader()
    desc, _ = writer.write("x", np.arange(4))
    assert len(_leftovers(owner)) == 1
    view = reader.read(desc, [])
    writer.close()
    writer.close()  # idempotent
    assert _leftovers(owner) == []
    assert list(view) == [0, 1, 2, 3]  # an existing mapping outlives the unlink
    with pytest.raises(RuntimeError):
        writer.write("y", np.arange(4))
    del view
    reader.close()

    crashed = [ShmChannel.writer(owner, 1 << 16) for _ in range(3)]  # as if the process died
    other = ShmChannel.writer(owner + "x", 1 << 16)
    removed = unlink_prefix(owner + "-")
    assert sorted(removed) == sorted(w.segment for w in crashed)
    assert _leftovers(owner) == [other.segment]
    for w in crashed + [other]:
        w.close()
    assert _leftovers(owner) == []


def _producer_that_dies(owner: str, conn) -> None:
    from omni.transport.shm import ShmChannel

    writer = ShmChannel.writer(owner, 1 << 16)
    desc, _ = writer.write("x", np.arange(8))
    conn.send(desc.segment)
    conn.recv()  # killed while waiting here: close() never runs


def test_unlink_prefix_cleans_up_after_a_killed_producer(owner):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_producer_that_dies, args=(owner, child), daemon=True)
    proc.start()
    assert parent.poll(60), "the producer did not start"
    segment = parent.recv()
    proc.kill()
    proc.join(10)
    assert _leftovers(owner) == [segment]
    assert unlink_prefix(owner + "-") == [segment]
    assert _leftovers(owner) == []


def test_reader_of_a_vanished_segment_raises_and_drops_dead_mappings(owner):
    reader = ShmChannel.reader()
    first = ShmChannel.writer(owner, 1 << 16)
    desc, _ = first.write("x", np.arange(3))
    reader.read(desc, [])
    first.close()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        reader.read(PayloadDesc(name="x", channel="shm", dtype="int64", shape=[3], segment=owner + "-gone", nbytes=24), [])
    second = ShmChannel.writer(owner, 1 << 16)
    reader.read(second.write("y", np.arange(3))[0], [])
    assert reader.segments == [second.segment]  # the restarted producer's arena replaced the dead one
    reader.close()
    second.close()


def test_bad_input_is_rejected(owner):
    with pytest.raises(ValueError):
        ShmChannel.writer("bad/owner", 1 << 16)
    with pytest.raises(ValueError):
        ShmChannel.writer(owner, -1)
    with pytest.raises(ValueError):
        unlink_prefix("")
    writer = ShmChannel.writer(owner, 1 << 16)
    with pytest.raises(TypeError):
        writer.write("objects", np.array([object()]))
    desc, _ = writer.write("x", np.arange(4))
    reader = ShmChannel.reader()
    with pytest.raises(ValueError, match="outside segment"):
        reader.read(PayloadDesc(name="x", channel="shm", dtype="int64", shape=[4], segment=desc.segment, offset=(1 << 16) - 8, nbytes=32), [])
    reader.close()
    writer.close()


def test_live_payloads_survive_random_churn(owner):
    writer, reader = ShmChannel.writer(owner, 1 << 18), ShmChannel.reader()
    rng = random.Random(5)
    live: dict[int, tuple[PayloadDesc, np.ndarray]] = {}
    for step in range(400):
        if live and (rng.random() < 0.45 or writer.stats()["used"] > (1 << 17)):
            token = rng.choice(list(live))
            desc, want = live.pop(token)
            assert np.array_equal(reader.read(desc, []), want)
            assert writer.free(token)
            continue
        want = np.full(rng.randint(1, 3000), step, dtype=np.int32)
        try:
            desc, _ = writer.write(f"p{step}", want)
        except ChannelFull:
            continue
        live[reader.token(desc)] = (desc, want)
    for desc, want in live.values():
        assert np.array_equal(reader.read(desc, []), want)
    reader.close()
    writer.close()


def _check_allocator(alloc: SlotAllocator, live: dict[int, tuple[int, int]]) -> None:
    spans = sorted([(off, size, "live") for off, size in live.values()] + [(o, s, "free") for o, s in alloc.free_blocks()])
    cursor = 0
    for (off, size, kind), nxt in zip(spans, spans[1:] + [None]):
        assert off == cursor, "gap or overlap between slots"
        assert off % alloc.align == 0 and size % alloc.align == 0 and size > 0
        if nxt is not None and kind == "free":
            assert nxt[2] == "live", "two adjacent free blocks were not coalesced"
        cursor = off + size
    assert cursor == alloc.capacity
    assert alloc.used == sum(size for _, size in live.values())


@pytest.mark.parametrize("seed", range(4))
def test_allocator_matches_a_model_under_random_alloc_and_free(seed):
    rng = random.Random(seed)
    alloc = SlotAllocator(capacity=64 * 500 + 17)
    live: dict[int, tuple[int, int]] = {}
    for _ in range(1500):
        if live and rng.random() < 0.5:
            token = rng.choice(list(live))
            assert alloc.free(token)
            assert not alloc.free(token)  # a double free changes nothing
            del live[token]
        else:
            nbytes = rng.choice([0, 1, 63, 64, 65, rng.randint(1, 4000), rng.randint(1, 20000)])
            got = alloc.alloc(nbytes)
            need = alloc.round_up(nbytes)
            if got is None:  # first fit only fails when no free block is large enough
                assert alloc.largest_free() < need
            else:
                token, offset = got
                assert token not in live
                live[token] = (offset, need)
                assert alloc.slot(token) == (offset, need)
        _check_allocator(alloc, live)
    for token in list(live):
        alloc.free(token)
    assert alloc.free_blocks() == [(0, alloc.capacity)]


def test_allocator_rejects_bad_sizes():
    with pytest.raises(ValueError):
        SlotAllocator(capacity=10)
    with pytest.raises(ValueError):
        SlotAllocator(capacity=1024, align=48)
    alloc = SlotAllocator(capacity=1024)
    with pytest.raises(ValueError):
        alloc.alloc(1025)
    with pytest.raises(ValueError):
        alloc.alloc(-1)
