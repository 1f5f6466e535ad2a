"""The DiT's fused path (modules/dit_fused.py, the fused q/k/v and modulation GEMMs) against its eager
path, in triton's interpreter on the CPU (float32): each kernel against the ops it replaces, and a
whole padded velocity forward of both tiny token2wav shapes with everything fused. GPU (`-m gpu`): the
same forward in bfloat16 on CUDA within bf16's tolerance, inside a CUDA graph."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from triton_interpreter import run_in_interpreter


def _inputs(model, lengths, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    frames = -(-max(lengths) // model.pad_frames) * model.pad_frames
    x = torch.randn(len(lengths), frames, model.latent_dim, generator=g, device=device)
    feats = torch.randn(len(lengths), frames, model.feature_dim, generator=g, device=device).to(model.feature_dtype)
    t = torch.rand(len(lengths), generator=g, device=device)
    return x, t, feats, torch.tensor(lengths, device=device)


def interpreter_check() -> None:
    """Runs in the child process (TRITON_INTERPRET=1)."""
    import tempfile

    from omni.layers import fused_ops
    from omni.layers.fused_linear import fuse_model_projections
    from omni.layers.rotary import apply_rope
    from omni.models.qwen2_5_omni.checkpoint.make_tiny import PRESETS, make_tiny
    from omni.models.qwen2_5_omni.modules import dit_fused
    from omni.models.qwen2_5_omni.modules.dit_layers import EPS, deinterleave
    from omni.models.qwen2_5_omni.modules.token2wav import Token2Wav

    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, 40, generator=g)
    params = torch.randn(3, 6 * 40, generator=g).chunk(6, dim=1)  # strided views, as the AdaNorm gives them
    eager = torch.nn.functional.layer_norm(x, (40,), eps=EPS) * (1 + params[1][:, None]) + params[0][:, None]
    torch.testing.assert_close(dit_fused.modulate(x, params[1], params[0], EPS), eager, rtol=0, atol=2e-6)
    qkv = torch.randn(2, 5, 3, 4, 12, generator=g)
    q, k, _ = qkv.unbind(2)
    cos, sin = torch.randn(5, 12, generator=g), torch.randn(5, 12, generator=g)
    want = [torch.cat((apply_rope(deinterleave(a[:, :, :1]), cos, sin), a[:, :, 1:]), dim=2) for a in (q, k)]
    dit_fused.rope_first_head_(q, k, cos, sin)
    assert torch.equal(q, want[0]) and torch.equal(k, want[1])

    with tempfile.TemporaryDirectory() as tmp:
        for preset in sorted(PRESETS):
            model = Token2Wav.from_checkpoint(make_tiny(Path(tmp) / preset, seed=1, preset=preset))
            block = model.pad_frames
            args = _inputs(model, [block + 3, 2 * block, 5])
            with torch.inference_mode():
                plain = model.velocity(*args)
            real = fused_ops.enabled
            fused_ops.enabled = lambda t: True
            try:
                assert fuse_model_projections(model) == 1 + len(model.code2wav_dit_model.transformer_blocks)
                with torch.inference_mode():
                    fused = model.velocity(*args)
            finally:
                fused_ops.enabled = real
            for i, n in enumerate(args[3].tolist()):
                peak = float(plain[i, :n].abs().max())
                torch.testing.assert_close(fused[i, :n], plain[i, :n], rtol=0, atol=1e-5 * peak)
    print("interpreter ok")


def test_fused_dit_matches_the_eager_dit_in_the_triton_interpreter():
    run_in_interpreter("import test_dit_fused as t; t.interpreter_check()", timeout=400)


@pytest.mark.gpu
def test_fused_dit_in_bfloat16_on_cuda_inside_a_graph(tmp_path):
    from omni.layers.fused_linear import fuse_model_projections
    from omni.models.qwen2_5_omni.checkpoint.make_tiny import make_tiny
    from omni.models.qwen2_5_omni.modules.token2wav import Token2Wav
    from omni.layers.graph_capture import capture_graph

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = Token2Wav.from_checkpoint(make_tiny(tmp_path / "t", seed=1, preset="tiny-a"), device="cuda")
    model.code2wav_dit_model.to(torch.bfloat16)
    args = _inputs(model, [model.pad_frames + 3, 2 * model.pad_frames, 5], device="cuda")
    with torch.inference_mode():
        plain = model.velocity(*args)
    assert fuse_model_projections(model) > 0
    graph, fused = capture_graph(lambda: model.velocity(*args), "cuda")
    graph.replay()
    for i, n in enumerate(args[3].tolist()):
        peak = float(plain[i, :n].abs().max())
        torch.testing.assert_close(fused[i, :n], plain[i, :n], rtol=0, atol=3e-2 * peak)


def test_kernels_compile_for_sm90_in_bf16():
    pytest.importorskip("triton", reason="triton is not installed")
    from test_fused_ops import _compile_for_sm90

    from omni.models.qwen2_5_omni.modules import dit_fused as f

    mod = {**{n: "*bf16" for n in ("x_ptr", "scale_ptr", "shift_ptr", "out_ptr")}, "eps": "fp32",
           **{n: "i32" for n in ("frames", "stride_x", "stride_p", "stride_o")}}
    _compile_for_sm90(f._modulate_kernel, mod, {"N": 1024, "BLOCK": 1024}, 4)
    rope = {**{n: "*bf16" for n in ("q_ptr", "k_ptr", "cos_ptr", "sin_ptr")},
            **{n: "i32" for n in ("frames", "stride_q", "stride_k", "stride_c")}}
    _compile_for_sm90(f._rope_first_head_kernel, rope, {"HALF": 32, "BLOCK_HALF": 32}, 1)
