"""Tensor parallelism for the built-in engine: one stage replica is a group of ranks.

The stage process is rank 0: it owns the engine (scheduler, KV block manager, sampler) and
spawns ranks 1..N-1 itself (fresh interpreters, `spawn`). Every rank holds its shard of the
weights (sliced at load time by the model's shard builder) and a KV cache of its own heads only.
Per step rank 0 broadcasts the step's inputs (the model's `step_inputs`: embeddings, positions,
any per-step rows) and the attention layout (each span's positions and block table), then every
rank runs the same `run_layers` in lockstep; the model's layers all-reduce after the attention
output projection and after the MLP / MoE down projection, so every rank ends with the full
hidden state. Logits and sampling happen on rank 0 only.

Collectives: NCCL when every rank has a GPU of its own, gloo otherwise (CPU, or several ranks
on one GPU, which NCCL refuses); the small step header always goes over a gloo group. The
process groups are built directly on a TCP store (no global default group), so a process may
hold several. CUDA graphs are off at N > 1 (capture with collectives is not done): decode runs
eagerly; the Triton decode kernel still runs, on each rank's own cache.

A model that can be split implements `step_inputs(batch) -> dict[str, Tensor]` (rank 0's part
that reads sequences) and `run_layers(inputs, batch) -> ForwardOutput` (reads only the inputs,
`batch.attend` and `batch.tap_layers`), and names a shard builder: "module:function" called as
`build(rank, size, device, all_reduce, **kwargs)`, returning that model's shard.

A dead rank (crash, kill) makes the current and every later step raise `TensorParallelError`:
the engine fails the requests involved, nothing waits on the dead rank (a watcher thread aborts an
NCCL group at once, whose kernels would otherwise wait on the GPU for the dead peer).
"""

from __future__ import annotations

import ctypes
import datetime
import importlib
import logging
import os
import pickle
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from omni.stages.ar.model_api import ARModel, ForwardBatch, ForwardOutput

log = logging.getLogger("omni.ar.tp")

STEP, STOP = "step", "stop"


class TensorParallelError(RuntimeError):
    """A rank of the group is gone or a collective failed: the group cannot run any more steps."""


@dataclass
class ShardRecipe:
    """How each rank builds its shard: `build` ("module:function") and its keyword arguments."""

    build: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self, rank: int, size: int, device: str, all_reduce: Callable) -> Any:
        module, _, attr = self.build.partition(":")
        return getattr(importlib.import_module(module), attr)(rank, size, device, all_reduce, **self.kwargs)


@dataclass
class CacheRecipe:
    """What a rank > 0 needs to allocate its KV cache the way rank 0's engine does."""

    num_blocks: int
    block_size: int
    dtype: str = ""  # "" = the model's dtype
    attention_backend: str = "torch"


def backend_for(devices: list[str]) -> str:
    """NCCL when every rank has a GPU of its own, else gloo."""
    if all(d.startswith("cuda") for d in devices) and len(set(devices)) == len(devices):
        return "nccl"
    return "gloo"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Groups:
    """This rank's process groups: `data` for tensors (NCCL or gloo), `ctrl` (gloo) for headers."""

    def __init__(self, backend: str, port: int, rank: int, size: int, timeout_s: float) -> None:
        import torch.distributed as dist

        self.dist, self.rank, self.size = dist, rank, size
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore("127.0.0.1", port, size, rank == 0, timeout=timeout)
        self.ctrl = dist.ProcessGroupGloo(dist.PrefixStore("ctrl", self.store), rank, size, timeout)
        if backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout  # NCCL's own watchdog gives up on a collective after this
            self.data = dist.ProcessGroupNCCL(dist.PrefixStore("data", self.store), rank, size, opts)
        else:
            self.data = self.ctrl

    def abort(self) -> None:
        """Abort the NCCL communicator, so that kernels queued on a dead peer stop waiting (gloo's
        sockets fail by themselves)."""
        if self.data is not self.ctrl:
            try:
                self.data.abort()
            except Exception as exc:  # best effort: the group is unusable either way
                log.warning("NCCL abort failed: %s", exc)

    def broadcast(self, tensor: torch.Tensor, group: Any = None) -> None:
        opts = self.dist.BroadcastOptions()
        opts.rootRank = 0
        (group or self.data).broadcast([tensor], opts).wait()

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        self.data.allreduce([tensor]).wait()
        return tensor

    def broadcast_object(self, obj: Any = None) -> Any:
        """Rank 0's `obj` on every rank (pickled through the gloo group)."""
        if self.rank == 0:
            raw = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            size = torch.tensor([raw.numel()], dtype=torch.long)
        else:
            size = torch.zeros(1, dtype=torch.long)
        self.broadcast(size, self.ctrl)
        if self.rank != 0:
            raw = torch.empty(int(size.item()), dtype=torch.uint8)
        self.broadcast(raw, self.ctrl)
        return obj if self.rank == 0 else pickle.loads(raw.numpy().tobytes())

    def barrier(self) -> None:
        self.ctrl.barrier().wait()


def _packet_tensors(inputs: dict[str, torch.Tensor | None]) -> list[tuple[str, tuple, str]]:
    return [(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in inputs.items() if v is not None]


def _layout(batch: ForwardBatch) -> dict[str, Any]:
    """The attention layout of a step as plain lists (ranks > 0 rebuild the metadata from it)."""
    return {"spans": [(s.start, s.end, list(s.seq.block_table)) for s in batch.spans], "taps": tuple(batch.tap_layers)}


def _attention(layout: dict[str, Any], block_size: int, device, kernel) -> Any:
    from omni.layers.paged_attention import AttentionMetadata

    spans = layout["spans"]
    slots = [table[p // block_size] * block_size + p % block_size for start, end, table in spans
             for p in range(start, end)]
    attn = AttentionMetadata.build(slots, [t for _, _, t in spans], [s for s, _, _ in spans],
                                   [e for _, e, _ in spans], block_size, device)
    attn.decode_kernel = kernel
    return attn


class TensorParallelModel(ARModel):
    """Rank 0's model: its own shard, plus the group that runs the other shards in lockstep."""

    supports_cuda_graphs = False  # capture with collectives is not done
    decode_form = None

    def __init__(self, shard: Any, groups: _Groups, workers: list[Any]) -> None:
        self.shard = shard
        self.groups = groups
        self.workers = workers
        self.broken: str | None = None
        self._watch = threading.Thread(target=self._watch_ranks, name="omni-tp-watch", daemon=True)
        self._watch.start()

    def _watch_ranks(self, period_s: float = 0.5) -> None:
        """A rank that dies mid-step leaves NCCL kernels waiting on the GPU, and the next host sync
        would wait with them: the group is aborted as soon as a rank is seen dead."""
        while self.broken is None and self.workers:
            dead = self._dead()
            if dead is not None:
                self.broken = dead
                self.groups.abort()
                return
            time.sleep(period_s)

    @classmethod
    def launch(cls, recipe: ShardRecipe, size: int, devices: list[str], cache: CacheRecipe,
               timeout_s: float = 300.0) -> "TensorParallelModel":
        """Spawn ranks 1..size-1, join the group as rank 0, build rank 0's shard, wait for all."""
        if size < 2 or len(devices) != size:
            raise ValueError(f"a tensor-parallel group needs size >= 2 and one device per rank, got {size}, {devices}")
        import torch.multiprocessing as mp

        from omni.gpu_env import keep_multicast_off

        keep_multicast_off()  # the ranks inherit this process's environment
        backend, port = backend_for(devices), _free_port()
        ctx = mp.get_context("spawn")
        workers = []
        for rank in range(1, size):
            proc = ctx.Process(target=_worker_main, args=(rank, size, port, backend, devices[rank], recipe, cache,
                                                          timeout_s, os.getpid()),
                               name=f"omni-tp-rank{rank}", daemon=True)
            proc.start()
            workers.append(proc)
        try:
            groups, shard = _join_as_rank0(recipe, size, devices[0], backend, port, timeout_s, workers)
        except BaseException:
            _stop(workers, 0.5)
            raise
        log.info("tensor-parallel group of %d ranks up (%s, devices %s)", size, backend, devices)
        return cls(shard, groups, workers)

    # ---- the step ---------------------------------------------------------------------
    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        self._check()
        inputs = self.shard.step_inputs(batch)
        try:
            self.groups.broadcast_object({"op": STEP, "layout": _layout(batch), "tensors": _packet_tensors(inputs)})
            for name, value in inputs.items():
                if value is not None:
                    self.groups.broadcast(value.contiguous())
            return self.shard.run_layers(inputs, batch)
        except RuntimeError as exc:  # gloo / NCCL: a peer closed the connection, a collective timed out
            self.broken = self._dead() or f"a collective failed: {exc}"
            raise TensorParallelError(f"tensor-parallel group broken: {self.broken}") from exc

    def _dead(self) -> str | None:
        for rank, proc in enumerate(self.workers, start=1):
            if proc.exitcode is not None:
                return f"rank {rank} exited with code {proc.exitcode}"
        return None

    def _check(self) -> None:
        if self.broken is None:
            self.broken = self._dead()
        if self.broken is not None:
            raise TensorParallelError(f"tensor-parallel group broken: {self.broken}")

    def shutdown(self) -> None:
        """Tell the ranks to stop, then make sure they have."""
        if self.broken is None and self.workers:
            try:
                self.groups.broadcast_object({"op": STOP})
            except RuntimeError:
                pass
        _stop(self.workers)
        self.workers = []
        self.broken = self.broken or "shut down"
        self._watch.join(2.0)

    # ---- everything else is rank 0's shard --------------------------------------------
    def kv_cache_spec(self):
        return self.shard.kv_cache_spec()

    def embed_tokens(self, input_ids):
        return self.shard.embed_tokens(input_ids)

    def compute_logits(self, hidden):
        return self.shard.compute_logits(hidden)

    def logits_processors(self):
        return self.shard.logits_processors()

    def prepare(self, seq, inputs):
        return self.shard.prepare(seq, inputs)

    def input_embeds(self, seq, start, end):
        return self.shard.input_embeds(seq, start, end)

    def positions(self, seq, start, end):
        return self.shard.positions(seq, start, end)

    def prefix_key(self, seq, start, end):
        return self.shard.prefix_key(seq, start, end)

    def input_ready(self, seq):
        return self.shard.input_ready(seq)

    def after_sample(self, seqs, tokens, hidden):
        return self.shard.after_sample(seqs, tokens, hidden)

    def release(self, seq):
        return self.shard.release(seq)

    def __getattr__(self, name: str) -> Any:  # cfg, dtype, device, ...
        if name in ("shard", "groups", "workers", "broken"):
            raise AttributeError(name)
        return getattr(self.shard, name)


def _join_as_rank0(recipe: ShardRecipe, size: int, device: str, backend: str, port: int, timeout_s: float,
                   workers: list[Any]) -> tuple[_Groups, Any]:
    """Join the group, build rank 0's shard, wait until every rank has its own. In a thread of its
    own, so that a rank that dies meanwhile (a bad checkpoint, no memory) fails the start at once
    rather than when the store's timeout ends."""
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))  # this thread's, and the stage's, current GPU
    box: dict[str, Any] = {}

    def join() -> None:
        try:
            if device.startswith("cuda"):
                torch.cuda.set_device(torch.device(device))
            groups = _Groups(backend, port, 0, size, timeout_s)
            shard = recipe(0, size, device, groups.all_reduce)
            groups.barrier()
            box["done"] = groups, shard
        except BaseException as exc:
            box["error"] = exc

    def dead() -> str | None:
        for rank, proc in enumerate(workers, start=1):
            if proc.exitcode is not None:
                return f"tensor-parallel rank {rank} exited with code {proc.exitcode} while starting (its log says why)"
        return None

    thread = threading.Thread(target=join, name="omni-tp-join", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)
        if thread.is_alive() and dead():
            raise TensorParallelError(dead())
    if "error" in box:  # gloo saw the peer go first: name the rank that died, if one did
        for proc in workers:
            proc.join(2.0)
        if dead():
            raise TensorParallelError(dead()) from box["error"]
        raise box["error"]
    return box["done"]


def _stop(workers: list[Any], timeout_s: float = 5.0) -> None:
    for proc in workers:
        proc.join(timeout_s)
        if proc.exitcode is None:
            proc.kill()
            proc.join(timeout_s)


# ---- ranks 1..N-1 -------------------------------------------------------------------------

def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_main(rank: int, size: int, port: int, backend: str, device: str, recipe: ShardRecipe,
                 cache: CacheRecipe, timeout_s: float, parent: int) -> None:
    """A rank > 0: build its shard and cache, then run every step rank 0 broadcasts until told to stop."""
    _die_with_parent()
    if os.getppid() != parent:
        return
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s tp-rank{rank} %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    try:
        groups = _Groups(backend, port, rank, size, timeout_s)
        shard = recipe(rank, size, device, groups.all_reduce)
        kv_cache, kernel = _worker_cache(shard, cache, device)
        groups.barrier()
    except BaseException:
        log.exception("rank %d could not start", rank)
        os._exit(1)  # at once: rank 0 watches for the exit code
    try:
        with torch.inference_mode():
            while True:
                header = groups.broadcast_object()
                if header["op"] == STOP:
                    break
                inputs = {}
                for name, shape, dtype in header["tensors"]:
                    inputs[name] = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                    groups.broadcast(inputs[name])
                layout = header["layout"]
                batch = ForwardBatch(
                    input_ids=torch.empty(0, dtype=torch.long, device=device), positions=inputs.get("positions"),
                    inputs_embeds=None, spans=[], attn=_attention(layout, cache.block_size, device, kernel),
                    kv_cache=kv_cache, tap_layers=layout["taps"])
                shard.run_layers(inputs, batch)
    except RuntimeError as exc:  # rank 0 is gone (or failed): nothing more to do
        log.warning("rank %d stops: %s", rank, exc)
        os._exit(1)
    os._exit(0)  # no teardown of the groups (their peers may be gone)


def _worker_cache(shard: Any, cache: CacheRecipe, device: str) -> tuple[torch.Tensor, Any]:
    """This rank's KV cache (its heads only) and decode kernel, as `AREngine` makes rank 0's."""
    from omni.layers.paged_attention import allocate_kv_cache
    from omni.stages.ar.config import EngineConfig
    from omni.stages.ar.engine import decode_kernel

    spec = shard.kv_cache_spec()
    dtype = getattr(torch, cache.dtype) if cache.dtype else spec.dtype
    kv = allocate_kv_cache(spec.num_layers, cache.num_blocks, cache.block_size, spec.num_kv_heads, spec.head_dim,
                           dtype, device)
    config = EngineConfig(block_size=cache.block_size, num_blocks=cache.num_blocks, device=device,
                          max_model_len=cache.block_size, attention_backend=cache.attention_backend)
    return kv, decode_kernel(config, kv)
