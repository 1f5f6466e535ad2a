"""The process side of a tensor-parallel group (see tensor_parallel.py): its process groups, the
step header every rank reads, and the loop of ranks 1..N-1.

Collectives: NCCL when every rank has a GPU of its own, gloo otherwise (CPU, or several ranks on
one GPU, which NCCL refuses); the small step header always goes over a gloo group. The groups are
built directly on a TCP store (no global default group), so a process may hold several.
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
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from omni.stages.ar.model_api import ForwardBatch

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
    attention_backend: str = "auto"


def backend_for(devices: list[str]) -> str:
    """NCCL when every rank has a GPU of its own, else gloo."""
    if all(d.startswith("cuda") for d in devices) and len(set(devices)) == len(devices):
        return "nccl"
    return "gloo"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Groups:
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


def packet_tensors(inputs: dict[str, torch.Tensor | None]) -> list[tuple[str, tuple, str]]:
    return [(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in inputs.items() if v is not None]


def step_layout(batch: ForwardBatch) -> dict[str, Any]:
    """The attention layout of a step as plain lists (ranks > 0 rebuild the metadata from it)."""
    return {"spans": [(s.start, s.end, list(s.seq.block_table)) for s in batch.spans], "taps": tuple(batch.tap_layers)}


def attention_metadata(layout: dict[str, Any], block_size: int, device, kernel) -> Any:
    from omni.layers.paged_attention import AttentionMetadata

    spans = layout["spans"]
    slots = [table[p // block_size] * block_size + p % block_size for start, end, table in spans
             for p in range(start, end)]
    attn = AttentionMetadata.build(slots, [t for _, _, t in spans], [s for s, _, _ in spans],
                                   [e for _, e, _ in spans], block_size, device)
    attn.decode_kernel = kernel
    return attn


# ---- ranks 1..N-1 -------------------------------------------------------------------------

def die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def worker_main(rank: int, size: int, port: int, backend: str, device: str, recipe: ShardRecipe,
                 cache: CacheRecipe, timeout_s: float, parent: int) -> None:
    """A rank > 0: build its shard and cache, then run every step rank 0 broadcasts until told to stop."""
    die_with_parent()
    if os.getppid() != parent:
        return
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s tp-rank{rank} %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    try:
        groups = Groups(backend, port, rank, size, timeout_s)
        shard = recipe(rank, size, device, groups.all_reduce)
        kv_cache, kernel = worker_cache(shard, cache, device)
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
                    inputs_embeds=None, spans=[], attn=attention_metadata(layout, cache.block_size, device, kernel),
                    kv_cache=kv_cache, tap_layers=layout["taps"])
                shard.run_layers(inputs, batch)
    except RuntimeError as exc:  # rank 0 is gone (or failed): nothing more to do
        log.warning("rank %d stops: %s", rank, exc)
        os._exit(1)
    os._exit(0)  # no teardown of the groups (their peers may be gone)


def worker_cache(shard: Any, cache: CacheRecipe, device: str) -> tuple[torch.Tensor, Any]:
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
