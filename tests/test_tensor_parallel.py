"""Tensor parallelism of the built-in engine's thinker on the CPU (two gloo processes).

- the split itself: each rank's slices of the MoE experts and of a dense MLP sum to the full
  layer's output, and sizes the ranks cannot divide are refused;
- through `ThinkerStage` (the stage is rank 0 and spawns rank 1): TP=2 gives the same greedy
  tokens as TP=1 on a tiny checkpoint, batched and with chunked prefill, and taps within float
  tolerance;
- a killed rank fails the requests in flight and every later one at once: no step hangs.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from kernel_helpers import unbatched
from omni.kernel.stage import StageContext
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.layers.tokenizer_offline import token_ids
from omni.models.qwen3_omni.config import load_config
from omni.models.qwen3_omni.modules.thinker import Qwen3OmniThinker
from omni.layers.mlp import GatedMLP
from omni.models.qwen3_omni.modules.thinker_tp import shard_config, shard_state
from omni.models.qwen3_omni.stages.thinker_stage import ThinkerStage
from omni.placement import rank_devices
from omni.stages.ar.tensor_parallel import TensorParallelError, TensorParallelModel, backend_for

IDS = token_ids()
START, END, USER, ASSISTANT = IDS["<|im_start|>"], IDS["<|im_end|>"], IDS["user"], IDS["assistant"]
PROMPTS = [[START, USER, 10, 3, 14, 15, 92, 7, END, 10, START, ASSISTANT, 10],
           [START, USER, 10, *range(200, 211), END, 10],
           [5, 6, 7]]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tp"), seed=5, preset="tiny-a")


# ---- the split ---------------------------------------------------------------------------

def test_expert_slices_sum_to_the_full_moe(ckpt):
    full = Qwen3OmniThinker.from_checkpoint(ckpt)
    cfg = load_config(ckpt).thinker
    state = full.state_dict()
    x = torch.randn(7, cfg.text.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        want = full.model.layers[0].mlp(x)
        parts = []
        for rank in range(2):
            shard = Qwen3OmniThinker(shard_config(cfg, 2))
            shard.load_weights(shard_state(state, rank, 2))
            assert shard.model.layers[0].mlp.experts.down_proj.shape[-1] == cfg.text.moe_intermediate_size // 2
            parts.append(shard.model.layers[0].mlp(x))
    torch.testing.assert_close(parts[0] + parts[1], want, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(parts[0], want)  # each rank alone is a partial sum


def test_dense_slices_sum_to_the_full_mlp():
    torch.manual_seed(0)
    full = GatedMLP(8, 12, "silu")
    state = {f"model.layers.0.mlp.{k}": v for k, v in full.state_dict().items()}
    x = torch.randn(3, 8)
    total = 0
    for rank in range(2):
        shard = GatedMLP(8, 6, "silu")
        shard.load_state_dict({k.split("mlp.")[1]: v for k, v in shard_state(state, rank, 2).items()})
        total = total + shard(x)
    torch.testing.assert_close(total, full(x), atol=1e-6, rtol=1e-5)


def test_sizes_the_ranks_cannot_divide_are_refused(ckpt):
    cfg = load_config(ckpt).thinker  # 4 query heads, 2 key/value heads
    assert shard_config(cfg, 2).text.num_kv_heads == 1
    with pytest.raises(ValueError, match="must divide"):
        shard_config(cfg, 4)


def test_rank_devices_and_backend():
    assert rank_devices("cpu", 2) == ["cpu", "cpu"]
    assert rank_devices("cuda:2", 3) == ["cuda:2", "cuda:3", "cuda:4"]
    assert backend_for(["cpu", "cpu"]) == "gloo"
    assert backend_for(["cuda:0", "cuda:1"]) == "nccl"
    assert backend_for(["cuda:0", "cuda:0"]) == "gloo"  # NCCL refuses two ranks on one GPU


# ---- through the stage -------------------------------------------------------------------

def _stage(ckpt, tp: int, **args) -> ThinkerStage:
    ctx = StageContext(name="thinker", args={"model_dir": str(ckpt), "block_size": 4, "num_blocks": 64,
                                             "max_model_len": 96, "max_num_batched_tokens": 8,
                                             "tensor_parallel_size": tp, **args},
                       in_ports=["tokens"], out_ports=["text", "hidden"])
    stage = ThinkerStage(ctx)
    stage.setup()
    return stage


def _run(stage: ThinkerStage, prompts, max_tokens: int = 10, timeout_s: float = 120.0):
    """Greedy tokens (and errors) per request, all requests batched."""
    tokens = {f"r{i}": [] for i in range(len(prompts))}
    errors, taps, done = {}, {r: [] for r in tokens}, set()
    for rid, prompt in zip(tokens, prompts):
        stage.open(rid, {"prompt_token_ids": prompt, "modalities": ["text", "audio"],
                         "sampling": {"thinker": {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True}}})
        stage.close_input(rid)
    deadline = time.monotonic() + timeout_s
    while stage.has_work():
        assert time.monotonic() < deadline, "the stage did not finish its requests"
        for e in unbatched(stage.step()):  # the step's hidden rows come as one batched chunk
            if e.error is not None:
                errors[e.rid] = e.error
            elif e.finish:
                done.add(e.rid)
            elif e.port == "text":
                tokens[e.rid] += e.data["token_ids"]
            elif e.port == "hidden":
                taps[e.rid].append(e.data["layer_1"])
    return tokens, errors, taps, done


def test_tp2_gives_the_greedy_tokens_of_tp1(ckpt):
    one = _stage(ckpt, 1)
    want, errors, want_taps, _ = _run(one, PROMPTS)
    one.teardown()
    assert not errors
    two = _stage(ckpt, 2)
    workers = list(two.engine.model.workers)
    try:
        assert isinstance(two.engine.model, TensorParallelModel)
        assert two.engine.kv_cache.shape[-2] == 1  # this rank's key/value heads only (2 in the model)
        got, errors, got_taps, done = _run(two, PROMPTS)
        assert not errors and done == set(want)
        assert got == want
        for rid in want:
            torch.testing.assert_close(torch.cat(got_taps[rid]), torch.cat(want_taps[rid]), atol=1e-5, rtol=1e-4)
        again, errors, _, _ = _run(two, PROMPTS[:1])  # the group keeps serving
        assert not errors and again["r0"] == want["r0"]
    finally:
        two.teardown()
    assert [p.exitcode for p in workers] == [0]  # told to stop, rank 1 left cleanly


def test_a_killed_rank_fails_requests_without_a_hang(ckpt):
    stage = _stage(ckpt, 2)
    worker = stage.engine.model.workers[0]
    try:
        _, errors, _, _ = _run(stage, PROMPTS[:1], max_tokens=2)
        assert not errors
        # rank 1 dies while a request is in flight
        stage.open("x", {"prompt_token_ids": PROMPTS[0], "sampling": {"thinker": {"temperature": 0, "max_tokens": 50}}})
        stage.close_input("x")
        stage.step()
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        t0 = time.monotonic()
        with pytest.raises(TensorParallelError, match="rank 1 exited"):
            for _ in range(60):
                stage.step()
        assert time.monotonic() - t0 < 30
        # in the actor the step's exception fails the request: the next requests fail at once too
        stage.abort("x")
        t0 = time.monotonic()
        with pytest.raises(TensorParallelError, match="broken"):
            _run(stage, PROMPTS[1:2], max_tokens=2)
        assert time.monotonic() - t0 < 5
    finally:
        stage.teardown()


def shard_or_fail(rank: int, size: int, device: str, all_reduce, **kwargs):
    """A shard builder whose rank 1 fails (as with a bad checkpoint), for the start-up test."""
    if rank > 0:
        raise RuntimeError("rank 1 cannot load its shard")
    from omni.models.qwen3_omni.modules.thinker_tp import build_shard

    return build_shard(rank, size, device, all_reduce, **kwargs)


def test_a_rank_that_fails_to_start_fails_the_start_at_once(ckpt):
    from omni.stages.ar.tensor_parallel import CacheRecipe, ShardRecipe

    recipe = ShardRecipe(f"{__name__}:shard_or_fail", {"model_dir": str(ckpt)})
    t0 = time.monotonic()
    with pytest.raises(TensorParallelError, match="rank 1 exited with code 1 while starting"):
        TensorParallelModel.launch(recipe, 2, ["cpu", "cpu"], CacheRecipe(64, 4), timeout_s=300)
    assert time.monotonic() - t0 < 60  # not the store's 300 s


# ---- through the kernel: the stage process is rank 0 -----------------------------------------

def test_through_the_kernel_tp2_serves_and_a_killed_rank_fails_requests_cleanly(ckpt):
    import asyncio

    import psutil

    from omni.kernel.errors import OmniError
    from omni.kernel.graph import OUT, EdgeSpec, Graph, StageSpec
    from omni.kernel.kernel import Kernel

    want, _, _, _ = _run(_one_stage := _stage(ckpt, 1), PROMPTS[:1], max_tokens=6)
    _one_stage.teardown()
    args = {"model_dir": str(ckpt), "block_size": 4, "num_blocks": 64, "max_model_len": 96,
            "tensor_parallel_size": 2}
    graph = Graph("tp", [StageSpec("thinker", "omni.models.qwen3_omni.stages.thinker_stage:ThinkerStage", args=args,
                                   max_restarts=0)],
                  [EdgeSpec("thinker", "text", OUT)])
    params = {"prompt_token_ids": PROMPTS[0],
              "sampling": {"thinker": {"temperature": 0, "max_tokens": 6, "ignore_eos": True}}}

    async def main():
        kernel = Kernel(graph, env={"OMP_NUM_THREADS": "1"})
        await kernel.start()
        try:
            events = await asyncio.wait_for(kernel.submit(params).collect(), 120)
            tokens = [t for e in events if e.port == "text" for t in e.data["token_ids"]]
            ranks = [p for p in psutil.Process(kernel.pid_of("thinker")).children()
                     if "spawn_main" in " ".join(p.cmdline())]  # not multiprocessing's resource tracker
            assert len(ranks) == 1 and ranks[0].environ().get("NCCL_NVLS_ENABLE") == "0"
            ranks[0].kill()
            await asyncio.sleep(0.5)  # a zombie until its parent, the stage, reaps it
            failures = []
            for _ in range(2):  # the request after the crash, and the one after that
                t0 = time.monotonic()
                with pytest.raises(OmniError) as caught:
                    await asyncio.wait_for(kernel.submit(params).collect(), 60)
                failures.append((str(caught.value), time.monotonic() - t0))
            return tokens, failures
        finally:
            await kernel.stop()

    tokens, failures = asyncio.run(main())
    assert tokens == want["r0"]
    for message, seconds in failures:
        assert "tensor-parallel group broken: rank 1 exited" in message and seconds < 30


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tp2_on_two_gpus_over_nccl_gives_the_greedy_tokens_of_tp1(ckpt):
    want, errors, want_taps, _ = _run(stage := _gpu_stage(ckpt, 1), PROMPTS)
    stage.teardown()
    assert not errors
    two = _gpu_stage(ckpt, 2)
    try:
        assert two.engine.model.groups.data is not two.engine.model.groups.ctrl  # NCCL for the tensors
        got, errors, got_taps, _ = _run(two, PROMPTS)
    finally:
        two.teardown()
    assert not errors and got == want
    for rid in want:
        torch.testing.assert_close(torch.cat(got_taps[rid]).cpu(), torch.cat(want_taps[rid]).cpu(),
                                   atol=1e-4, rtol=1e-3)


def _gpu_stage(ckpt, tp: int) -> ThinkerStage:
    ctx = StageContext(name="thinker", device="cuda:0",
                       args={"model_dir": str(ckpt), "block_size": 4, "num_blocks": 64, "max_model_len": 96,
                             "max_num_batched_tokens": 8, "tensor_parallel_size": tp, "attention_backend": "triton"},
                       in_ports=["tokens"], out_ports=["text", "hidden"])
    stage = ThinkerStage(ctx)
    stage.setup()
    return stage
