"""Tensor parallelism for the built-in engine: one stage replica is a group of ranks.

The stage process is rank 0: it owns the engine (scheduler, KV block manager, sampler) and
spawns ranks 1..N-1 itself (fresh interpreters, `spawn`). Every rank holds its shard of the
weights (sliced at load time by the model's shard builder) and a KV cache of its own heads only.
Per step rank 0 broadcasts the step's inputs (the model's `step_inputs`: embeddings, positions,
any per-step rows) and the attention layout (each span's positions and block table), then every
rank runs the same `run_layers` in lockstep; the model's layers all-reduce after the attention
output projection and after the MLP / MoE down projection, so every rank ends with the full
hidden state. Logits and sampling happen on rank 0 only.

Collectives: NCCL between GPUs, gloo on the CPU or for several ranks on one GPU (tp_group.py,
with the ranks' loop). CUDA graphs are off at N > 1 (capture with collectives is not done): decode runs
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

import logging
import os
import threading
import time
from typing import Any

import torch

from omni.stages.ar.model_api import ARModel, ForwardBatch, ForwardOutput
from omni.stages.ar.tp_group import (STEP, STOP, CacheRecipe, Groups, ShardRecipe, TensorParallelError, backend_for,
                                     free_port, packet_tensors, step_layout, worker_main)

log = logging.getLogger("omni.ar.tp")

__all__ = ["CacheRecipe", "ShardRecipe", "TensorParallelError", "TensorParallelModel", "backend_for"]


class TensorParallelModel(ARModel):
    """Rank 0's model: its own shard, plus the group that runs the other shards in lockstep."""

    supports_cuda_graphs = False  # capture with collectives is not done
    decode_form = None

    def __init__(self, shard: Any, groups: Groups, workers: list[Any]) -> None:
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
        backend, port = backend_for(devices), free_port()
        ctx = mp.get_context("spawn")
        workers = []
        for rank in range(1, size):
            proc = ctx.Process(target=worker_main, args=(rank, size, port, backend, devices[rank], recipe, cache,
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
            self.groups.broadcast_object({"op": STEP, "layout": step_layout(batch), "tensors": packet_tensors(inputs)})
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

    def decode_inputs(self, seqs, starts):
        return self.shard.decode_inputs(seqs, starts)

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
                   workers: list[Any]) -> tuple[Groups, Any]:
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
            groups = Groups(backend, port, 0, size, timeout_s)
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
