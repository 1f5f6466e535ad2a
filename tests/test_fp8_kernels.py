"""The FP8 Triton kernels (issue 28): the block-scaled dense GEMM (`fp8_gemm`) and the fused MoE
with FP8 experts (`moe_fp8`).

CPU: in triton's interpreter (a child process: TRITON_INTERPRET=1 must be set before triton is
imported) the kernels run with real e4m3 weights and their block scales, but with float32
activations (`act_fp8=False`): the interpreter's float -> float8 cast rounds wrongly at binade
edges (124.7 -> 64), so on the CPU the kernels' indexing and scale arithmetic are checked, not the
activation rounding. Both kernels also compile ahead of time for SM 9.0 (H100/H200, no GPU needed)
with e4m3 tensor-core dots. GPU (`-m gpu`): each kernel against the dequantized bf16 matmul at
M = 1, 16, 64, 512 on the real Qwen3-Omni-30B-A3B shapes, and inside a CUDA graph.

Tolerances (GPU): against the same maths in float32 (x quantized per 128-group as the kernel does,
times the dequantized weights) max |err| <= 1e-2 max |ref| (bf16 output, accumulation order);
against the dequantized bf16 matmul (x unquantized) max |err| <= 8e-2 max |ref| and RMS err <=
5e-2 RMS ref for the dense GEMM (e4m3 activations carry 3 mantissa bits: an element's rounding is up
to 2^-4 of it, ~2.7% RMS, and stays that in a sum of independent terms); for the MoE, whose x and h
are both rounded (h's error adds the gate and up errors through SiLU), 1e-1 and 8e-2.
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from omni.layers.fp8 import quantize_blocks
from omni.layers.fp8_gemm import Fp8GemmError, block_fp8_matmul, quantized_activations, reference_matmul
from omni.layers.fp8_modules import dequantize_experts, quantize_experts
from omni.layers.moe_routed import per_expert
from triton_interpreter import run_in_interpreter


# Qwen3-Omni-30B-A3B (presets_full): thinker hidden 2048, 32 q / 4 kv heads of 128, 128 experts top-8 of
# 768; talker hidden 1024, 16 q / 2 kv heads of 128, 128 experts top-8 of 384, shared expert 768.
DENSE = {"thinker.q_proj": (4096, 2048), "thinker.kv_proj": (512, 2048), "thinker.o_proj": (2048, 4096),
         "talker.q_proj": (2048, 1024), "talker.kv_proj": (256, 1024), "talker.o_proj": (1024, 2048),
         "talker.shared_up": (768, 1024), "talker.shared_down": (1024, 768)}
MOE = {"thinker": (128, 8, 2048, 768), "talker": (128, 8, 1024, 384)}
ROWS = (1, 16, 64, 512)


def _dense_case(rows, n, k, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, k, generator=gen, device=device)
    x[:, : k // 2] *= 4  # groups of different ranges
    w = torch.randn(n, k, generator=gen, device=device) / k**0.5
    q, s = quantize_blocks(w)
    return x.to(dtype), q, s


def _moe_case(tokens, experts, top_k, hidden, inner, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen, device=device)
    gate_up = torch.randn(experts, 2 * inner, hidden, generator=gen, device=device) / hidden**0.5
    down = torch.randn(experts, hidden, inner, generator=gen, device=device) / inner**0.5
    probs = torch.randn(tokens, experts, generator=gen, device=device).softmax(-1)
    weights, chosen = probs.topk(top_k, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    (gq, gs), (dq, ds) = quantize_experts(gate_up, "gate_up_proj"), quantize_experts(down, "down_proj")
    return x.to(dtype), weights.to(dtype), chosen, gq, gs, dq, ds


def _moe_reference(x, weights, chosen, gq, gs, dq, ds, quantize_act: bool):
    """float32 per-expert loop over the dequantized experts; `quantize_act`: x and h quantized per
    128-group as the kernels do (h rounded to x's dtype between the GEMMs, as they store it)."""
    def q(a):
        return quantized_activations(a) if quantize_act else a.float()

    gate_up = dequantize_experts(gq, gs, "gate_up_proj", torch.float32)
    down = dequantize_experts(dq, ds, "down_proj", torch.float32)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in chosen.unique().tolist():
        rows, slot = torch.where(chosen == e)
        g, u = (q(x[rows]) @ gate_up[e].T).chunk(2, dim=-1)
        h = (F.silu(g) * u).to(x.dtype)
        out.index_add_(0, rows, (q(h) @ down[e].T) * weights[rows, slot, None].float())
    return out


def whole_block_thinker(device: str = "cpu", dtype=torch.float32, seed: int = 0):
    """A random thinker whose decoder linears are whole 128x128 blocks (what the FP8 kernels take)."""
    from omni.models.qwen3_omni.checkpoint.presets_full import scaled_config
    from omni.models.qwen3_omni.checkpoint.random_load import random_thinker
    from omni.models.qwen3_omni.config import _thinker

    text = scaled_config()["thinker_config"]["text_config"]
    text.update(vocab_size=512, hidden_size=128, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                head_dim=64, moe_intermediate_size=128, num_experts=4, num_experts_per_tok=2)
    text["rope_parameters"]["mrope_section"] = [16, 8, 8]
    return random_thinker(_thinker({"text_config": text}), device, dtype, seed=seed, std=0.05)


def _err(got, ref):
    return (got.float() - ref).abs().max().item() / ref.abs().max().item()


# ---- CPU ---------------------------------------------------------------------------------

def test_split_k_fills_the_gpu_at_decode_sizes():
    from omni.layers.fp8_gemm import pick_config, split_k

    for rows, n, k, want in ((1, 512, 2048, 16), (1, 4096, 2048, 2), (1, 2048, 4096, 4), (16, 1024, 768, 6),
                             (64, 4096, 2048, 2), (512, 512, 2048, 16), (2048, 4096, 2048, 1)):
        assert split_k(rows, n, k, pick_config(rows)) == want, (rows, n, k)


def test_typed_errors_for_what_the_gemm_does_not_take():
    x, q, s = _dense_case(2, 256, 256)
    with pytest.raises(Fp8GemmError):
        block_fp8_matmul(x[:, :128], q, s)
    with pytest.raises(Fp8GemmError):
        block_fp8_matmul(x, q, s[:1])
    q2, s2 = quantize_blocks(torch.randn(200, 256))
    with pytest.raises(Fp8GemmError, match="whole"):
        block_fp8_matmul(x, q2, s2)


def interpreter_check() -> None:
    """Runs in the child process: both kernels vs the float32 reference of the same maths."""
    from omni.layers.fp8_gemm import GemmConfig
    from omni.layers.moe_fp8 import Fp8MoeConfig, fused_fp8_experts

    for rows, n, k in ((1, 256, 384), (5, 128, 256), (33, 384, 128)):
        x, q, s = _dense_case(rows, n, k, seed=rows)
        ref = reference_matmul(x, q, s, quantize_act=False)
        for cfg in (GemmConfig(16, 32), GemmConfig(32, 64, split_k=1), GemmConfig(16, 16, split_k=k // 128)):
            got = block_fp8_matmul(x, q, s, act_fp8=False, config=cfg)
            assert got.shape == (rows, n) and _err(got, ref) <= 1e-5, (rows, n, k, cfg, _err(got, ref))
    for tokens, experts, top_k, hidden, inner in ((1, 4, 2, 256, 128), (6, 8, 3, 128, 256)):
        x, w, c, gq, gs, dq, ds = _moe_case(tokens, experts, top_k, hidden, inner, seed=tokens)
        ref = _moe_reference(x, w, c, gq, gs, dq, ds, quantize_act=False)
        loop = per_expert(x, w, c, dequantize_experts(gq, gs, "gate_up_proj", x.dtype),
                          dequantize_experts(dq, ds, "down_proj", x.dtype), F.silu)
        assert _err(loop, ref) <= 1e-5
        for cfg in (Fp8MoeConfig(16, 32, 64), Fp8MoeConfig(32, 64, 32)):
            got = fused_fp8_experts(x, w, c, gq, gs, dq, ds, config=cfg, act_fp8=False)
            assert got.shape == x.shape and _err(got, ref) <= 1e-5, (tokens, cfg, _err(got, ref))
    print("interpreter ok")


def test_kernels_match_the_float_reference_in_the_triton_interpreter():
    run_in_interpreter("import test_fp8_kernels as t; t.interpreter_check()")


def test_kernels_compile_for_sm90_with_e4m3_tensor_core_dots():
    pytest.importorskip("triton", reason="triton is not installed")
    from test_moe_triton import _compile_for_sm90

    from omni.layers import fp8_gemm, moe_fp8

    ints = ("M", "num_pairs", "stride_xm", "stride_wn", "stride_sn", "stride_om", "stride_xt", "stride_we",
            "stride_se", "stride_hp", "stride_yp")
    types = {**{n: "i32" for n in ints}, "x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "out_ptr": "*bf16",
             "h_ptr": "*bf16", "y_ptr": "*fp32", "route_ptr": "*bf16", "sorted_ids_ptr": "*i32",
             "block_expert_ptr": "*i32"}
    kernels = []
    for rows, n in ((1, 512), (1, 4096), (64, 4096), (512, 4096)):
        cfg = fp8_gemm.pick_config(rows)
        split = fp8_gemm.split_k(rows, n, 2048, cfg)
        kernels.append(_compile_for_sm90(fp8_gemm._block_fp8_gemm, types, dict(
            N=n, K=2048, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, ACT_FP8=True, SPLIT_K=split),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    for pairs in (8, 512):
        cfg = moe_fp8.pick_config(pairs)
        opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        gemm = dict(HIDDEN=2048, INNER=768, BLOCK_M=cfg.block_m, ACT_FP8=True)
        kernels.append(_compile_for_sm90(moe_fp8._gate_up_swiglu_fp8, types, dict(gemm, TOP_K=8, BLOCK_N=cfg.block_n),
                                         **opts))
        kernels.append(_compile_for_sm90(moe_fp8._down_weighted_fp8, types, dict(gemm, BLOCK_N=cfg.down_block_n), **opts))
    for kernel in kernels:
        ptx = kernel.asm["ptx"]
        assert "e4m3" in ptx and kernel.metadata.shared <= 200 * 1024  # e4m3 casts and mma / wgmma on e4m3


# ---- on the GPU --------------------------------------------------------------------------

def _dense_errors(rows, n, k, seed):
    x, q, s = _dense_case(rows, n, k, torch.bfloat16, "cuda", seed)
    got = block_fp8_matmul(x, q, s)
    exact = reference_matmul(x, q, s, quantize_act=True)
    bf16 = x.float() @ (q.float() * s.repeat_interleave(128, 0).repeat_interleave(128, 1)).T
    rms = ((got.float() - bf16).pow(2).mean().sqrt() / bf16.pow(2).mean().sqrt()).item()
    return got, _err(got, exact), _err(got, bf16), rms


@pytest.mark.gpu
@pytest.mark.parametrize("shape", sorted(DENSE))
@pytest.mark.parametrize("rows", ROWS)
def test_block_fp8_gemm_matches_the_dequantized_bf16_matmul(shape, rows):
    pytest.importorskip("triton")
    n, k = DENSE[shape]
    got, err_exact, err_bf16, rms = _dense_errors(rows, n, k, seed=rows)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    assert err_exact <= 1e-2, err_exact
    assert err_bf16 <= 8e-2 and rms <= 5e-2, (err_bf16, rms)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", sorted(MOE))
@pytest.mark.parametrize("tokens", ROWS)
def test_fp8_moe_matches_the_dequantized_bf16_experts(shape, tokens):
    pytest.importorskip("triton")
    from omni.layers.moe_fp8 import fused_fp8_experts

    case = _moe_case(tokens, *MOE[shape], torch.bfloat16, "cuda", seed=tokens)
    got = fused_fp8_experts(*case)
    exact = _moe_reference(*case, quantize_act=True)
    bf16 = _moe_reference(*case, quantize_act=False)
    rms = ((got.float() - bf16).pow(2).mean().sqrt() / bf16.pow(2).mean().sqrt()).item()
    assert got.dtype == torch.bfloat16 and got.shape == case[0].shape
    assert _err(got, exact) <= 1e-2, _err(got, exact)
    assert _err(got, bf16) <= 1e-1 and rms <= 8e-2, (_err(got, bf16), rms)


@pytest.mark.gpu
def test_fp8_kernels_inside_a_cuda_graph():
    pytest.importorskip("triton")
    from omni.layers.moe_fp8 import fused_fp8_experts

    x, q, s = _dense_case(16, 4096, 2048, torch.bfloat16, "cuda", seed=1)
    case = list(_moe_case(16, *MOE["thinker"], torch.bfloat16, "cuda", seed=1))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compiles outside the capture
            block_fp8_matmul(x, q, s), fused_fp8_experts(*case)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dense, moe = block_fp8_matmul(x, q, s), fused_fp8_experts(*case)
    for seed in (2, 3):  # new inputs and routing copied into the captured buffers
        x.copy_(_dense_case(16, 4096, 2048, torch.bfloat16, "cuda", seed=seed)[0])
        for buf, new in zip(case[:3], _moe_case(16, *MOE["thinker"], torch.bfloat16, "cuda", seed=seed)[:3]):
            buf.copy_(new)
        graph.replay()
        torch.testing.assert_close(dense, block_fp8_matmul(x, q, s), rtol=0, atol=0)
        torch.testing.assert_close(moe, fused_fp8_experts(*case), rtol=0, atol=0)


@pytest.mark.gpu
def test_fp8_thinker_on_the_engine_with_cuda_graphs():
    """An FP8 thinker (Fp8Linear + FP8 experts) decodes from CUDA graphs with the fused ops on, and its
    prompt's final hidden states stay within activation rounding of the dequantized bf16 model's."""
    pytest.importorskip("triton")
    from omni.layers.fp8_format import Fp8Format
    from omni.layers.fp8_modules import Fp8Linear, quantize_
    from omni.stages.ar.config import EngineConfig
    from omni.stages.ar.engine import AREngine
    from omni.stages.ar.sequence import SamplingParams

    kept, ref = whole_block_thinker("cuda", torch.bfloat16), whole_block_thinker("cuda", torch.bfloat16)
    quantize_(kept, Fp8Format(), keep_fp8=True)
    quantize_(ref, Fp8Format(), keep_fp8=False)
    assert isinstance(kept.model.layers[0].self_attn.o_proj, Fp8Linear)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (5, 9, 17, 30)]

    def run(model, graphs: bool):
        layers = model.cfg.text.num_layers
        eng = AREngine(model, EngineConfig(block_size=16, num_blocks=64, max_num_seqs=4, max_model_len=128,
                                           device="cuda", cuda_graphs=graphs, attention_backend="triton",
                                           tap_layers=(layers,)))
        seqs = [eng.add_request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
                                return_hidden=True) for i, p in enumerate(prompts)]
        prefill = {}
        while eng.has_unfinished():
            for out in eng.step():
                prefill.setdefault(out.rid, out.taps[layers])  # the first rows: the prompt's
        hidden = torch.cat([prefill[s.rid][: len(p)] for s, p in zip(seqs, prompts)]).float()
        return [t for s in seqs for t in s.output_token_ids], hidden, eng.stats()

    graphed, hidden, stats = run(kept, True)
    eager, _, _ = run(kept, False)
    _, hidden_ref, _ = run(ref, True)
    assert stats.get("decode_graph_steps"), stats
    assert sum(x == y for x, y in zip(graphed, eager)) >= 0.9 * len(eager)
    cos = torch.nn.functional.cosine_similarity(hidden, hidden_ref, dim=-1)
    assert cos.mean() >= 0.99 and cos.min() >= 0.95, (cos.mean(), cos.min())  # the prompt rows, teacher-forced
