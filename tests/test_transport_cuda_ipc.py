"""The cuda_ipc channel. On CPU: the module imports without torch and fails clearly without a GPU.
On a GPU (`-m gpu`): zero-copy round trips into a spawned process, event ordering, back pressure,
and no sidecar left in /dev/shm."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import subprocess
import sys
import uuid
from unittest import mock

import numpy as np
import pytest
import torch

from omni.transport.channels import ChannelFull, load_channel
from omni.kernel.messages import RequestChunk, encode
from omni.transport.cuda_ipc import CudaIpcChannel, unlink_process_leftovers
from omni.transport.shm import SHM_DIR, unlink_prefix

gpu = pytest.mark.gpu


def _leftovers(prefix: str) -> list[str]:
    return [e for e in os.listdir(SHM_DIR) if e.startswith(prefix)]


@pytest.fixture
def owner():
    prefix = f"omni-test-{uuid.uuid4().hex[:10]}"
    yield prefix
    unlink_prefix(prefix)


def _digest(t: torch.Tensor) -> str:
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy()
    return hashlib.sha256(raw.tobytes()).hexdigest()


def test_channel_is_registered_and_importable_without_torch():
    assert load_channel("cuda_ipc") is CudaIpcChannel
    code = "import sys, omni.transport.cuda_ipc; assert 'torch' not in sys.modules, 'torch imported eagerly'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_write_without_a_gpu_fails_clearly(owner):
    writer = CudaIpcChannel.writer(owner, 1 << 16)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        writer.write("x", torch.zeros(4))
    writer.close()
    assert _leftovers(owner) == []


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError):
        CudaIpcChannel.writer("bad/owner", 1 << 16)
    with pytest.raises(ValueError):
        CudaIpcChannel.writer("omni-test-x", -5)


def test_unlink_process_leftovers_removes_only_that_pids_files():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    mine = [f"torch_{pid}_123_0", f"cuda.shm.0.{pid:x}.1"]
    others = [f"torch_{pid}0_1_0", f"cuda.shm.0.{pid:x}0.1", f"omni-test-{pid}"]
    for name in mine + others:
        open(os.path.join(SHM_DIR, name), "wb").close()
    try:
        assert unlink_process_leftovers(pid) == sorted(mine)
        assert all(os.path.exists(os.path.join(SHM_DIR, name)) for name in others)
    finally:
        for name in mine + others:
            if os.path.exists(os.path.join(SHM_DIR, name)):
                os.unlink(os.path.join(SHM_DIR, name))


# ---- GPU ------------------------------------------------------------------------------------


def _child(conn) -> None:
    """Reads descriptors from a pipe and answers what it saw; runs in a spawned process."""
    import torch

    from omni.kernel.messages import decode
    from omni.transport.cuda_ipc import CudaIpcChannel

    reader = CudaIpcChannel.reader()
    while True:
        op, *args = conn.recv()
        if op == "done":
            conn.send(reader.segments)
            reader.close()
            return
        payloads = decode(args[0]).payloads
        if op == "read":
            answer = []
            for d in payloads:
                t = reader.read(d, [])
                base, size = reader.pool_range(d.segment)
                inside = d.nbytes == 0 or base <= t.data_ptr() and t.data_ptr() + d.nbytes <= base + size
                answer.append((d.name, _digest(t), tuple(t.shape), str(t.dtype), t.is_cuda, inside))
            conn.send((answer, [reader.token(d) for d in payloads]))
        elif op == "fill":  # write through the views: the producer must see it in its own pool
            for d in payloads:
                reader.read(d, []).view(torch.uint8).fill_(args[1]) if d.nbytes else None
            torch.cuda.synchronize()
            conn.send("filled")
        elif op == "race":  # peek without waiting (stale while the producer sleeps), then read properly
            d = payloads[0]
            base_tensor = reader._pools[d.segment].tensor if d.segment in reader._pools else None
            if base_tensor is None:
                reader.read(d, [])  # opens the pool (and waits: only the first call)
                base_tensor = reader._pools[d.segment].tensor
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                peek = base_tensor[d.offset : d.offset + d.nbytes].view(torch.float32).sum()
            side.synchronize()
            waited = reader.read(d, []).sum().item()
            conn.send((peek.item(), waited))


def _spawn_child(target=_child, *args):
    """A spawned process running `target(conn, *args)`; returns it and our end of the pipe."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, *args), daemon=True)
    proc.start()
    return proc, parent


def _reap(proc, writer) -> None:
    """Kill a child that is still running, close the producer, remove what the child left."""
    if proc.is_alive():
        proc.kill()
        proc.join(10)
    writer.close()
    unlink_process_leftovers(proc.pid)


def _ask(conn, *msg):
    conn.send(msg)
    assert conn.poll(120), "the child process did not answer"
    return conn.recv()


def _gpu_samples() -> dict[str, object]:
    g = torch.Generator(device="cuda").manual_seed(0)
    dev = "cuda"
    return {
        "f32": torch.randn(3, 5, device=dev, generator=g),
        "f16": torch.randn(2, 7, device=dev, generator=g).half(),
        "bf16": torch.randn(4, 8, device=dev, generator=g).bfloat16(),
        "i64": torch.arange(-5, 6, device=dev),
        "bool": torch.rand(13, device=dev, generator=g) > 0.5,
        "u8": torch.arange(65, device=dev, dtype=torch.uint8),
        "c64": torch.randn(4, device=dev, generator=g, dtype=torch.complex64),
        "scalar": torch.tensor(2.5, device=dev),
        "empty": torch.zeros(0, 3, device=dev),
        "strided": torch.arange(24, device=dev, dtype=torch.float32).reshape(4, 6).t(),
        "from_cpu": torch.arange(10, dtype=torch.int32),
        "numpy": np.arange(6, dtype=np.float64).reshape(2, 3),
    }


@gpu
def test_round_trip_into_a_spawned_process_is_zero_copy(owner):
    proc, conn = _spawn_child()
    writer = CudaIpcChannel.writer(owner, 1 << 20)
    try:
        samples = _gpu_samples()
        descs = [writer.write(name, value)[0] for name, value in samples.items()]
        assert all(d.channel == "cuda_ipc" and d.segment.startswith(owner) for d in descs)
        answer, tokens = _ask(conn, "read", encode(RequestChunk(rid="r", edge=0, payloads=descs)))
        for name, digest, shape, dtype, is_cuda, inside in answer:
            want = samples[name]
            want = torch.from_numpy(want) if isinstance(want, np.ndarray) else want
            assert digest == _digest(want), name
            assert shape == tuple(want.shape) and dtype == str(want.dtype), name
            assert is_cuda and inside, f"{name}: the view does not lie inside the opened pool"

        target = descs[0]
        assert _ask(conn, "fill", encode(RequestChunk(rid="r", edge=0, payloads=[target])), 7) == "filled"
        torch.cuda.synchronize()
        assert bool((writer._pool[target.offset : target.offset + target.nbytes] == 7).all())

        for token in tokens:
            if token is not None:
                assert writer.free(token)
        assert writer.stats()["used"] == 0
        assert _ask(conn, "done") == [writer.segment]
        proc.join(60)
        assert proc.exitcode == 0
    finally:
        _reap(proc, writer)
    assert _leftovers(owner) == []


@gpu
def test_reader_waits_for_the_producers_copy(owner):
    proc, conn = _spawn_child()
    writer = CudaIpcChannel.writer(owner, 1 << 24)
    n = 1 << 20
    try:
        first, _ = writer.write("zeros", torch.zeros(n, device="cuda"))
        torch.cuda.synchronize()
        peek, waited = _ask(conn, "race", encode(RequestChunk(rid="r", edge=0, payloads=[first])))
        assert waited == 0.0
        assert writer.free(int.from_bytes(first.extra[:8], "little"))

        ones = torch.ones(n, device="cuda")
        torch.cuda.synchronize()
        torch.cuda._sleep(3_000_000_000)  # the copy into the pool queues behind ~1.5 s of GPU time
        second, _ = writer.write("ones", ones)
        assert second.offset == first.offset  # same slot: stale zeros are there until the copy runs
        peek, waited = _ask(conn, "race", encode(RequestChunk(rid="r", edge=0, payloads=[second])))
        assert waited == float(n), "the reader did not wait for the producer's event"
        assert peek == 0.0, "the race this test guards against did not happen (sleep too short?)"
        _ask(conn, "done")
        proc.join(60)
    finally:
        _reap(proc, writer)


@gpu
def test_channel_full_then_success_after_free_in_process(owner):
    writer, reader = CudaIpcChannel.writer(owner, 1 << 16), CudaIpcChannel.reader()
    try:
        block = torch.ones(16 << 10, dtype=torch.uint8, device="cuda")
        descs = [writer.write(f"b{i}", block)[0] for i in range(4)]
        with pytest.raises(ChannelFull):
            writer.write("more", block)
        with pytest.raises(ValueError, match="exceeds the whole arena"):
            writer.write("huge", torch.zeros((1 << 16) + 1, dtype=torch.uint8, device="cuda"))
        assert writer.free(reader.token(descs[1]))
        desc, _ = writer.write("more", block * 2)
        assert desc.offset == descs[1].offset and desc.offset % 64 == 0
        view = reader.read(desc, [])  # same process: the writer's own pool, no IPC
        assert view.data_ptr() == writer._pool.data_ptr() + desc.offset
        assert int(view.sum()) == 2 * block.numel() and int(reader.read(descs[2], []).sum()) == block.numel()
        writer.free_all()
        assert not writer.free(reader.token(descs[0]))  # a stale credit after free_all
        assert writer.stats()["used"] == 0
    finally:
        reader.close()
        writer.close()
    assert _leftovers(owner) == []


@gpu
def test_unlink_prefix_removes_the_sidecar_of_a_dead_producer(owner):
    writer = CudaIpcChannel.writer(owner, 1 << 16)
    writer.write("x", torch.zeros(4, device="cuda"))
    assert _leftovers(owner) == [writer.segment]
    assert unlink_prefix(owner + "-") == [writer.segment]
    reader = CudaIpcChannel.reader()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        reader.read(writer.write("y", torch.zeros(4, device="cuda"))[0], [])
    writer.close()
    assert _leftovers(owner) == []


def _cuda_producer_that_dies(owner: str, conn) -> None:
    import torch

    from omni.transport.cuda_ipc import CudaIpcChannel

    writer = CudaIpcChannel.writer(owner, 1 << 20)
    writer.write("x", torch.ones(8, device="cuda"))
    conn.send(os.getpid())
    conn.recv()  # killed while waiting here


@gpu
def test_a_killed_producer_leaves_nothing_after_cleanup(owner):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_cuda_producer_that_dies, args=(owner, child), daemon=True)
    proc.start()
    assert parent.poll(120), "the producer did not start"
    pid = parent.recv()
    proc.kill()
    proc.join(30)
    assert len(_leftovers(owner)) == 1
    unlink_prefix(owner + "-")
    unlink_process_leftovers(pid)
    names = os.listdir(SHM_DIR)
    assert not [n for n in names if n.startswith(owner) or n.startswith(f"torch_{pid}_") or f".{pid:x}." in n]


# ---- a consumer on another GPU ----------------------------------------------------------------

class _FakePool:
    """An opened pool as the reader sees it, on "cuda:0", its bytes in host memory (CPU tests)."""

    def __init__(self, data: torch.Tensor) -> None:
        self.device = torch.device("cuda", 0)
        self.tensor = data.reshape(-1).view(torch.uint8)
        self.capacity = self.tensor.numel()
        self.events = mock.MagicMock()
        self.events.query.return_value = False  # the producer's copy is still queued

    def event(self, index: int):
        return self.events


def _fake_read(device, data: torch.Tensor):
    """`reader.read` of all of `data` from a fake pool on cuda:0, the CUDA calls mocked; returns
    (result, reader, the mocked torch.cuda, the calls of the copy onto the consumer's GPU)."""
    from omni.kernel.messages import PayloadDesc
    from omni.transport import cuda_ipc

    reader = CudaIpcChannel.reader(device)
    reader._pools["omni-test-seg"] = _FakePool(data)
    desc = PayloadDesc(name="x", channel="cuda_ipc", dtype=str(data.dtype).removeprefix("torch."),
                       shape=list(data.shape), segment="omni-test-seg", nbytes=data.numel() * data.element_size(),
                       offset=0, extra=cuda_ipc._EXTRA.pack(5, 3))
    copies = []

    def copy(view, target):
        copies.append((target, fake_cuda.current_stream.call_count))
        return view.clone()

    with mock.patch.object(torch, "cuda") as fake_cuda, mock.patch.object(cuda_ipc, "copy_to_device", copy):
        fake_cuda.can_device_access_peer.return_value = False
        out = reader.read(desc, [])
    return out, reader, fake_cuda, copies


def test_a_consumer_on_another_gpu_gets_a_device_to_device_copy():
    data = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    out, reader, fake_cuda, copies = _fake_read("cuda:1", data)
    assert torch.equal(out, data) and out.data_ptr() != reader._pools["omni-test-seg"].tensor.data_ptr()
    # the copy comes after the wait on the producer's event, on the pool GPU's stream
    fake_cuda.current_stream.assert_called_with(torch.device("cuda", 0))
    fake_cuda.current_stream.return_value.wait_event.assert_called_once()
    assert copies == [(torch.device("cuda", 1), 1)]
    fake_cuda.device.assert_called_with(torch.device("cuda", 0))
    assert reader.copies == 1 and reader.peer == {(0, 1): False}


@pytest.mark.parametrize("device", [None, "cuda:0", "cpu"])
def test_a_consumer_on_the_pools_gpu_gets_the_view_itself(device):
    data = torch.arange(6, dtype=torch.int64)
    out, reader, _, copies = _fake_read(device, data)
    assert copies == [] and reader.copies == 0
    assert out.data_ptr() == reader._pools["omni-test-seg"].tensor.data_ptr()  # zero copies
    assert torch.equal(out, data)


def _child_on(conn, device: str) -> None:
    """Reads one descriptor as a consumer placed on `device`; answers what it got."""
    import torch

    from omni.kernel.messages import decode
    from omni.transport.cuda_ipc import CudaIpcChannel

    reader = CudaIpcChannel.reader(device)
    _, raw = conn.recv()
    t = reader.read(decode(raw).payloads[0], [])
    torch.cuda.synchronize(t.device)
    reader.fence()
    conn.send((str(t.device), _digest(t), reader.copies, reader.peer))
    reader.close()


@gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_a_consumer_on_the_second_gpu_reads_the_first_gpus_pool(owner):
    proc, parent = _spawn_child(_child_on, "cuda:1")
    writer = CudaIpcChannel.writer(owner, 1 << 20)
    try:
        value = torch.randn(64, 33, device="cuda:0")
        desc = writer.write("x", value)[0]
        device, digest, copies, peer = _ask(parent, "read", encode(RequestChunk(rid="r", edge=0, payloads=[desc])))
        assert device == "cuda:1" and digest == _digest(value) and copies == 1
        assert list(peer) == [(0, 1)]
        print("peer access cuda:1 -> cuda:0:", peer[(0, 1)])
        proc.join(60)
        assert proc.exitcode == 0
    finally:
        _reap(proc, writer)
