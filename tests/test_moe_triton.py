"""The fused Triton MoE (`moe_triton`) against the existing routed-expert paths.

CPU: the expert-block layout is checked for its invariants (no triton needed); the kernels run
in triton's interpreter in a child process (TRITON_INTERPRET=1 must be set before triton is
imported) in float32 and float16 (the interpreter has no bfloat16) against the "bmm" path in
float64. GPU (`-m gpu`): bf16 at small, talker and thinker shapes for T in {1, 3, 16, 200},
error no worse than the grouped GEMM's against a float32 reference, and inside a CUDA graph.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from omni.layers import moe_routed
from omni.layers.moe_routed import MoeBackendError, choose_backend, routed_experts, use_moe_backend
from omni.layers.moe_triton import MoeInputError, align_pairs, fused_routed_experts, max_blocks

ROOT = Path(__file__).resolve().parents[1]


def _case(tokens, experts, top_k, hidden, inner, dtype, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)  # drawn where used: thinker weights are 1.2 GB
    x = torch.randn(tokens, hidden, generator=gen, device=device)
    gate_up = torch.randn(experts, 2 * inner, hidden, generator=gen, device=device) / hidden**0.5
    down = torch.randn(experts, hidden, inner, generator=gen, device=device) / inner**0.5
    probs = torch.randn(tokens, experts, generator=gen, device=device).softmax(-1)
    weights, chosen = probs.topk(top_k, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    return [t.to(device, dtype) for t in (x, weights)] + [chosen.to(device)] + [
        t.to(device, dtype) for t in (gate_up, down)]


def _reference(x, weights, chosen, gate_up, down, dtype=torch.float64):
    """The existing "bmm" path in a wide dtype, on the CPU."""
    args = [t.cpu().to(dtype) for t in (x, weights)] + [chosen.cpu()] + [t.cpu().to(dtype) for t in (gate_up, down)]
    return routed_experts(*args, act=F.silu, backend="bmm")


# ---- CPU ----------------------------------------------------------------------------------

@pytest.mark.parametrize("tokens,experts,top_k,block_m", [(1, 8, 2, 16), (7, 5, 3, 16), (64, 128, 8, 16), (300, 16, 4, 32)])
def test_layout_holds_each_pair_once_in_its_experts_blocks(tokens, experts, top_k, block_m):
    chosen = _case(tokens, experts, top_k, 4, 2, torch.float32, seed=tokens)[2]
    sorted_ids, block_expert = align_pairs(chosen, experts, block_m)
    pairs = chosen.numel()
    assert block_expert.numel() == max_blocks(pairs, experts, block_m)
    rows = sorted_ids.view(-1, block_m)
    real = sorted_ids[sorted_ids < pairs]
    assert sorted(real.tolist()) == list(range(pairs))
    assert (sorted_ids[sorted_ids >= pairs] == pairs).all()
    flat = chosen.reshape(-1)
    for b, e in enumerate(block_expert.tolist()):
        ids = rows[b][rows[b] < pairs]
        if e < 0:
            assert ids.numel() == 0
        else:
            assert ids.numel() > 0 and (flat[ids.long()] == e).all()


def test_worst_case_routing_fits_the_static_block_count():
    experts, top_k, block_m = 16, 2, 16
    chosen = torch.arange(experts).view(-1, top_k)  # every expert hit exactly once
    sorted_ids, block_expert = align_pairs(chosen, experts, block_m)
    assert (block_expert >= 0).all() and block_expert.numel() == experts


def test_backend_choice_and_typed_errors(monkeypatch):
    x = torch.zeros(2, 4)
    monkeypatch.setattr(moe_routed, "_FORCED", None)
    assert choose_backend(x, F.silu) == "bmm"  # CPU: neither triton nor grouped_mm
    with pytest.raises(MoeBackendError):
        choose_backend(x, F.silu, "cutlass")
    with pytest.raises(MoeBackendError):
        choose_backend(x, F.silu, "grouped")
    with pytest.raises(MoeBackendError):
        use_moe_backend("nope")  # a stage's moe_backend arg
    use_moe_backend("grouped")  # forced for the process: refused where it cannot run
    with pytest.raises(MoeBackendError):
        routed_experts(*_case(2, 4, 2, 8, 4, torch.float32), act=F.silu)
    x, w, c, gu, d = _case(2, 4, 2, 8, 4, torch.float32)
    with pytest.raises(MoeInputError):
        fused_routed_experts(x, w, c, gu, d[:, :, :3])
    with pytest.raises(MoeInputError):
        fused_routed_experts(x[:1], w, c, gu, d)


def interpreter_check() -> None:
    """Runs in the child process: kernels (and the one-launch layout) vs the bmm path."""
    from omni.layers.moe_triton import MoeConfig, layout

    cases = [(1, 8, 2, 64, 32), (5, 6, 3, 48, 40), (9, 128, 8, 40, 16)]
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 3e-3)):
        for tokens, experts, top_k, hidden, inner in cases[: 3 if dtype == torch.float32 else 1]:
            x, w, c, gu, d = _case(tokens, experts, top_k, hidden, inner, dtype, seed=tokens)
            ref = _reference(x, w, c, gu, d)
            for cfg in (MoeConfig(16, 16, 16, 16, 32), MoeConfig(32, 32, 32, 16, 16)):
                got = fused_routed_experts(x, w, c, gu, d, config=cfg)
                err = (got.double() - ref).abs().max().item() / ref.abs().max().item()
                assert got.dtype == dtype and err <= tol, (dtype, tokens, cfg, err)
            got = routed_experts(x, w, c, gu, d, act=F.silu, backend="triton")
            assert (got.double() - ref).abs().max().item() <= tol * ref.abs().max().item()
            for block_m in (16, 32):
                assert all(torch.equal(a, b) for a, b in zip(layout(c, experts, block_m), align_pairs(c, experts, block_m)))
    print("interpreter ok")


def test_kernels_match_the_bmm_path_in_the_triton_interpreter():
    pytest.importorskip("triton", reason="triton is not installed (the kernels' CPU check needs its interpreter)")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    code = "import test_moe_triton as t; t.interpreter_check()"
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and "interpreter ok" in proc.stdout, proc.stderr[-4000:]


def _compile_for_sm90(fn, types: dict, consts: dict, **options):
    """Ahead-of-time compile for an H100/H200 (triton ships ptxas): no GPU needed."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import triton

    names = fn.arg_names
    sig = {n: "constexpr" if n in consts else types[n] for n in names}
    const = {(i,): consts[n] for i, n in enumerate(names) if n in consts}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n not in consts and n != "num_pairs"}
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def test_kernels_compile_for_sm90_with_pipelined_weight_loads():
    pytest.importorskip("triton", reason="triton is not installed")
    from omni.layers import moe_triton as m

    cfg = m.pick_config(8)
    ints = ("num_pairs", "stride_xt", "stride_we", "stride_wn", "stride_hp", "stride_yp")
    types = {**{n: "i32" for n in ints}, "x_ptr": "*bf16", "w_ptr": "*bf16", "h_ptr": "*bf16", "y_ptr": "*fp32",
             "route_ptr": "*bf16", "sorted_ids_ptr": "*i32", "block_expert_ptr": "*i32", "chosen_ptr": "*i64"}
    gemm = dict(HIDDEN=2048, INNER=768, BLOCK_M=cfg.block_m, IEEE=False)
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    up = _compile_for_sm90(m._gate_up_swiglu, types, dict(gemm, TOP_K=8, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k), **opts)
    dn = _compile_for_sm90(m._down_weighted, types, dict(gemm, BLOCK_N=cfg.down_block_n, BLOCK_K=cfg.down_block_k), **opts)
    for kernel in (up, dn):  # cp.async: the K loop is software-pipelined (weight bytes in flight)
        assert "cp.async" in kernel.asm["ptx"] and kernel.metadata.shared <= 200 * 1024
    n_blocks = m.max_blocks(512, 128, 16)
    _compile_for_sm90(m._align_one_program, {**types, "PAIRS": "i32", "N_BLOCKS": "i32"},
                      dict(EXPERTS=128, BLOCK_M=16, CHUNK=64, BLOCK_E=128, BLOCK_B=256, BLOCK_P=512), num_warps=8)


# ---- on the GPU ---------------------------------------------------------------------------

SHAPES = {"small": (16, 4, 192, 96), "talker": (128, 8, 1024, 384), "thinker": (128, 8, 2048, 768)}


def _loop_fp32(x, weights, chosen, gate_up, down):
    """Per-expert loop in float32 on the GPU (host syncs are fine in a test)."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in chosen.unique().tolist():
        rows, slot = torch.where(chosen == e)
        gate, up = (x[rows].float() @ gate_up[e].float().T).chunk(2, dim=-1)
        out.index_add_(0, rows, (F.silu(gate) * up) @ down[e].float().T * weights[rows, slot, None].float())
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("tokens", [1, 3, 16, 200])
def test_triton_matches_the_reference_in_bf16_on_cuda(shape, tokens):
    pytest.importorskip("triton")
    experts, top_k, hidden, inner = SHAPES[shape]
    args = _case(tokens, experts, top_k, hidden, inner, torch.bfloat16, "cuda", seed=tokens)
    assert choose_backend(args[0], F.silu) == "triton"
    ref = _loop_fp32(*args)
    scale = ref.abs().max().item()
    got = routed_experts(*args, act=F.silu)
    grouped = routed_experts(*args, act=F.silu, backend="grouped")
    err = (got.float() - ref).abs().max().item()
    err_grouped = (grouped.float() - ref).abs().max().item()
    assert got.dtype == torch.bfloat16 and got.shape == ref.shape
    assert err <= 1e-2 * scale, (err, scale)
    assert err <= max(1.5 * err_grouped, 4e-3 * scale), (err, err_grouped)


@pytest.mark.gpu
def test_triton_moe_inside_a_cuda_graph():
    pytest.importorskip("triton")
    experts, top_k, hidden, inner = SHAPES["talker"]
    x, w, c, gu, d = _case(16, experts, top_k, hidden, inner, torch.bfloat16, "cuda", seed=1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compiles outside the capture
            routed_experts(x, w, c, gu, d, act=F.silu, backend="triton")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = routed_experts(x, w, c, gu, d, act=F.silu, backend="triton")
    for seed in (2, 3):  # new inputs and new routing, copied into the captured buffers
        nx, nw, nc = _case(16, experts, top_k, hidden, inner, torch.bfloat16, "cuda", seed=seed)[:3]
        x.copy_(nx), w.copy_(nw), c.copy_(nc)
        graph.replay()
        eager = routed_experts(x, w, c, gu, d, act=F.silu, backend="triton")
        torch.testing.assert_close(out, eager, rtol=0, atol=0)
        ref = _loop_fp32(x, w, c, gu, d)
        assert (out.float() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()
