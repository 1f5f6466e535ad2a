"""CUDA graphs for AR decode, the Triton paged decode kernel, and the CUDA path against the CPU path.

On CPU (CI): the graph runner's fixed-shape, padded decode path (what gets captured on a GPU)
runs eagerly and must give the same greedy tokens as the plain engine, padding rows must stay
in their scratch block, and the Triton kernel (when triton is importable, in its interpreter)
must match torch attention. Marked `gpu`: graphs on vs off, CUDA vs CPU (thinker tokens and
talker codes, float32 with TF32 off), and the kernel on the device.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.modules.thinker import Qwen3OmniThinker
from omni.layers.paged_attention import AttentionMetadata, paged_attention
from omni.stages.ar.config import EngineConfig, EngineConfigError
from omni.stages.ar.cuda_graphs import batch_buckets
from omni.stages.ar.engine import AREngine
from omni.stages.ar.sequence import SamplingParams
from triton_interpreter import run_in_interpreter

PROMPTS = [list(range(60, 67)), list(range(97, 100)), [70 + (i * 7) % 50 for i in range(150)]]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    # a filled talker router: transformers' zero router makes every talker expert choice a top-k tie,
    # which CPU and CUDA break differently (bench/talker_parity_gpu.py)
    return str(make_tiny(tmp_path_factory.mktemp("tiny-b"), seed=2, preset="tiny-b", fill_talker_router=True))


def _thinker(ckpt, device="cpu"):
    return Qwen3OmniThinker.from_checkpoint(ckpt, device=device, dtype=torch.float32)


def _run(model, device="cpu", n=10, sampled=False, warmup=False, **cfg):
    config = EngineConfig(block_size=16, num_blocks=48, max_num_seqs=8, max_model_len=512, device=device, **cfg)
    engine = AREngine(model, config)
    if warmup:
        engine.warmup([()])
    params = [SamplingParams(temperature=0.0, max_tokens=n + i, ignore_eos=True) for i in range(len(PROMPTS))]
    if sampled:  # the talker's default sampling and a top-p row, seeded, beside a greedy row
        params[0] = SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05, seed=3, max_tokens=n,
                                   ignore_eos=True)
        params[1] = SamplingParams(temperature=1.0, top_p=0.8, presence_penalty=0.5, seed=4, max_tokens=n + 1,
                                   ignore_eos=True)
    tokens = engine.generate(PROMPTS, params)
    return tokens, engine


def test_buckets_and_config():
    assert batch_buckets(1) == [1]
    assert batch_buckets(5) == [1, 2, 4, 5]
    assert batch_buckets(32) == [1, 2, 4, 8, 16, 24, 32]
    with pytest.raises(EngineConfigError, match="attention_backend"):
        EngineConfig(attention_backend="cudnn")
    with pytest.raises(EngineConfigError, match="cuda_graph_max_batch"):
        EngineConfig(cuda_graph_max_batch=-1)


def test_fixed_shape_decode_path_matches_eager_on_cpu(ckpt):
    model = _thinker(ckpt)
    want, plain = _run(model)
    got, engine = _run(model, cuda_graphs=True)
    assert got == want and len(set(want[0])) > 1
    stats = engine.stats()
    assert stats["decode_graph_steps"] > 10 and stats["graphs_disabled"] is None
    assert stats["graphs"] == 0  # nothing is captured on CPU; the same padded path runs eagerly
    assert stats["shapes"] >= 2  # 3 then 2 then 1 running sequences: several buckets
    assert engine.kv_cache.shape[2] == 48 + 1 and plain.kv_cache.shape[2] == 48  # the scratch block
    # padding rows wrote only the scratch block: the real blocks hold what the plain engine wrote
    assert engine.kv_cache[:, :, 48].abs().sum() > 0
    torch.testing.assert_close(engine.kv_cache[:, :, :48], plain.kv_cache, rtol=1e-3, atol=1e-4)
    # a smaller largest bucket: bigger batches run eagerly, smaller ones padded, same tokens
    got_small, small = _run(model, cuda_graphs=True, cuda_graph_max_batch=2)
    assert got_small == want and small.stats()["decode_graph_steps"] > 0


def test_sampled_decode_path_matches_eager_on_cpu(ckpt):
    """The padded graph body samples inside (on CPU run eagerly): the same seeded draws as the
    plain engine, and the same as each request alone."""
    model = _thinker(ckpt)
    want, _ = _run(model, sampled=True)
    got, engine = _run(model, sampled=True, cuda_graphs=True)
    assert got == want and want[0] != want[2][: len(want[0])]
    assert engine.stats()["decode_graph_steps"] > 10
    config = EngineConfig(block_size=16, num_blocks=48, max_num_seqs=8, max_model_len=512)
    alone = AREngine(model, config).generate([PROMPTS[1]], [SamplingParams(temperature=1.0, top_p=0.8,
                                                                           presence_penalty=0.5, seed=4,
                                                                           max_tokens=11, ignore_eos=True)])
    assert alone[0] == want[1]


def test_models_without_graph_support_run_eagerly(ckpt, caplog):
    class NoGraphs(Qwen3OmniThinker):
        supports_cuda_graphs = False

    model = NoGraphs.from_checkpoint(ckpt, dtype=torch.float32)
    want, _ = _run(_thinker(ckpt))
    with caplog.at_level("WARNING"):
        got, engine = _run(model, cuda_graphs=True)
    assert got == want and "decode_graph_steps" not in engine.stats()
    assert "does not support CUDA graphs" in caplog.text


def _random_cache(device, dtype, hkv=2, dim=32, block=16, blocks=12, layers=2, seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    cache = torch.randn(layers, 2, blocks, block, hkv, dim, generator=gen).to(device, dtype)
    return cache


def _decode_meta(lens, tables, block, device):
    slots = [tables[b][(n - 1) // block] * block + (n - 1) % block for b, n in enumerate(lens)]
    return AttentionMetadata.build(slots, tables, [n - 1 for n in lens], lens, block, device)


def _kernel_vs_torch(device, dtype, tol, long=False):
    """The kernel against torch's paged attention; `long`: contexts over several of the kernel's
    tiles (PAGE_TOKENS), a partial last tile and the padded tail of a block table."""
    from omni.layers.triton_attention import paged_decode_attention

    hq, hkv, dim, block = 8, 2, 32, 16
    if long:
        cache = _random_cache(device, dtype, hkv, dim, block, blocks=24)
        lens, tables = [1, 64, 65, 150], [[3], [0, 7, 9, 1], [11, 2, 5, 4, 20], [i for i in range(10)] + [23, 12]]
        tables = [t + [0] * (12 - len(t)) for t in tables]  # the engine's tables are padded to one width
    else:
        cache = _random_cache(device, dtype, hkv, dim, block)
        lens, tables = [1, 17, 40], [[3], [0, 7], [11, 2, 5]]
    meta = _decode_meta(lens, tables, block, device)
    gen = torch.Generator(device="cpu").manual_seed(1)
    n = len(lens)
    q = torch.randn(n, hq, dim, generator=gen).to(device, dtype)
    k = torch.randn(n, hkv, dim, generator=gen).to(device, dtype)
    v = torch.randn(n, hkv, dim, generator=gen).to(device, dtype)
    ref = paged_attention(cache.clone(), 1, meta, q, k, v, scale=dim**-0.5)
    paged_attention(cache, 1, meta, q, k, v, scale=dim**-0.5)  # writes k/v like the engine does
    got = paged_decode_attention(cache, 1, q, meta.block_tables, meta.seq_lens, dim**-0.5)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert (got.float() - ref.float()).abs().max().item() <= tol


def test_triton_kernel_matches_torch_in_the_interpreter():
    """In a child process: TRITON_INTERPRET=1 must be set before triton is imported."""
    run_in_interpreter("import torch, test_cuda_graphs as t; t._kernel_vs_torch('cpu', torch.float32, 1e-5); "
                       "t._kernel_vs_torch('cpu', torch.float32, 1e-5, long=True); print('interpreter ok')")


# ---- on the GPU ----------------------------------------------------------------------------

@pytest.mark.gpu
def test_graphs_on_and_off_agree_on_cuda(ckpt, exact_cuda):
    model = _thinker(ckpt, "cuda")
    want, _ = _run(model, "cuda")
    got, engine = _run(model, "cuda", cuda_graphs=True)
    assert got == want
    stats = engine.stats()
    assert stats["graphs_disabled"] is None and stats["graphs"] >= 2 and stats["decode_graph_steps"] > 10
    assert stats["time_s"]["gpu"] > 0  # the engine's GPU clock (omni/stages/gpu_clock.py) saw its steps
    cpu, _ = _run(_thinker(ckpt))
    assert want == cpu  # the CUDA path gives the CPU path's greedy tokens


@pytest.mark.gpu
def test_sampled_graphs_equal_sampled_eager_and_nothing_captured_late(ckpt, exact_cuda):
    """Sampling inside the captured graphs draws what the eager sampler draws for the same seeds;
    after `warmup` no step captures (every bucket, both sampler modes, were captured at start)."""
    model = _thinker(ckpt, "cuda")
    want, _ = _run(model, "cuda", sampled=True)
    got, engine = _run(model, "cuda", sampled=True, warmup=True, cuda_graphs=True, attention_backend="triton")
    stats = engine.stats()
    assert stats["graphs_disabled"] is None and stats["graph_late_captures"] == 0
    assert stats["graphs"] == len(engine.runner.graphs.keys(model.decode_form, [()]))  # all captured at warmup
    assert got == want


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_triton_kernel_matches_torch_on_cuda(dtype, tol):
    pytest.importorskip("triton")
    _kernel_vs_torch("cuda", dtype, tol)
    _kernel_vs_torch("cuda", dtype, tol, long=True)


@pytest.mark.gpu
def test_triton_backend_with_graphs_gives_the_same_tokens(ckpt, exact_cuda):
    model = _thinker(ckpt, "cuda")
    want, _ = _run(model, "cuda")
    got, engine = _run(model, "cuda", cuda_graphs=True, attention_backend="triton")
    assert engine.runner.decode_kernel is not None and engine.stats()["graphs"] >= 1
    assert got == want


@pytest.mark.gpu
def test_cuda_graph_path_equals_cpu_path_end_to_end(ckpt, exact_cuda):
    """Thinker tokens and every talker code through the whole graph: CPU vs CUDA with CUDA graphs
    in both AR stages (and the Triton decode kernel in the thinker, the code predictor's graphs in the
    talker); code2wav on the GPU too; waveforms close."""
    from omni.models.qwen3_omni.graph import build
    from qwen3_fixtures import LoopThread, RunningKernel, expose_codes, params, prompts

    loop = LoopThread()
    results = {}
    try:
        for name, options in {
            "cpu": {},
            "cuda": {"device": "cuda", "stage_args": {"thinker": {"cuda_graphs": True, "attention_backend": "triton"},
                                                      "talker": {"cuda_graphs": True}}},
        }.items():
            graph, _ = build(ckpt, threads=1, **options)
            with RunningKernel(loop, expose_codes(graph), mode="inline") as kernel:
                results[name] = {k: kernel.one(params(m, "ethan", 12, 30, ignore_eos=True)) for k, m in prompts().items()
                                 if k in ("text", "audio")}
    finally:
        loop.close()
    for kind, cpu in results["cpu"].items():
        cuda = results["cuda"][kind]
        assert cuda.tokens == cpu.tokens and len(set(cpu.tokens)) > 1
        assert cpu.codes is not None and cuda.codes is not None and (cuda.codes == cpu.codes).all()
        peak = float(np.abs(cpu.pcm).max())
        assert cuda.pcm.shape == cpu.pcm.shape and float(np.abs(cuda.pcm - cpu.pcm).max()) <= 1e-4 * peak
