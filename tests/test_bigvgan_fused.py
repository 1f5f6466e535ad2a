"""BigVGAN's fused anti-aliased Snake (modules/alias_free_fused.py) against the eager activation, in
triton's interpreter on the CPU: one activation at several shapes (short rows that clamp at both
ends, channel-strided views). An sm90 compile catches what the interpreter lets by. GPU (`-m gpu`):
a whole tiny BigVGAN with every activation fused within float32 noise of the eager one."""

from __future__ import annotations

import contextlib

import pytest
import torch
from triton_interpreter import run_in_interpreter

from omni.layers import fused_ops


@contextlib.contextmanager
def _fused(on: bool):
    """The fused kernels forced on (the interpreter's CPU tensors) or off (the eager path on CUDA)."""
    real = fused_ops.enabled
    fused_ops.enabled = lambda t: on
    try:
        yield
    finally:
        fused_ops.enabled = real


def interpreter_check() -> None:
    """Runs in the child process (TRITON_INTERPRET=1)."""
    from omni.models.qwen2_5_omni.modules.alias_free import AliasFreeSnake

    g = torch.Generator().manual_seed(2)
    act = AliasFreeSnake(6)
    with torch.no_grad():
        act.act.alpha.normal_(0, 0.5, generator=g)
        act.act.beta.normal_(0, 0.5, generator=g)
    for shape in ((2, 6, 1), (1, 6, 5), (3, 6, 300)):
        x = torch.randn(*shape, generator=g)
        for view in (x, torch.randn(shape[0], 12, shape[2], generator=g)[:, ::2]):
            with torch.no_grad():
                want = act(view)
                with _fused(True):
                    got = act(view)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * float(want.abs().max()))

    print("interpreter ok")


def test_fused_snake_matches_the_eager_activation_in_the_triton_interpreter():
    run_in_interpreter("import test_bigvgan_fused as t; t.interpreter_check()", timeout=400)


def test_the_kernel_compiles_for_sm90():
    pytest.importorskip("triton", reason="triton is not installed")
    from test_fused_ops import _compile_for_sm90

    from omni.models.qwen2_5_omni.modules import alias_free_fused as f

    types = {**{n: "*fp32" for n in ("x_ptr", "alpha_ptr", "inv_beta_ptr", "up_ptr", "down_ptr", "out_ptr")},
             **{n: "i32" for n in ("channels", "frames", "stride_n", "stride_c")}}
    _compile_for_sm90(f._alias_free_snake_kernel, types,
                      {"PAD_UP": 5, "CROP": 15, "PAD_DOWN": 5, "TAPS": 12, "BLOCK": f.BLOCK_T}, 4)


@pytest.mark.gpu
def test_the_fused_vocoder_on_cuda_equals_the_eager_one(tmp_path):
    from omni.models.qwen2_5_omni.checkpoint.make_tiny import make_tiny
    from omni.models.qwen2_5_omni.modules.token2wav import Token2Wav

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    voc = Token2Wav.from_checkpoint(make_tiny(tmp_path / "t", seed=1, preset="tiny-b"), device="cuda").code2wav_bigvgan_model
    mel = torch.randn(3, voc.cfg.mel_dim, 64, device="cuda") - 3
    with torch.inference_mode():
        fused = voc(mel)
        with _fused(False):
            eager = voc(mel)
    torch.testing.assert_close(fused, eager, rtol=0, atol=1e-4 * float(eager.abs().max()))
