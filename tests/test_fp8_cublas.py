"""The cuBLAS block-scaled FP8 path of the dense FP8 GEMM (omni/layers/fp8_cublas.py): its activation
rounding is the Triton kernel's, its choice is probed per device and can be forced; on a GPU (marked)
it equals the kernels' reference maths at the thinker's shapes."""

from __future__ import annotations

import pytest
import torch

from omni.layers import fp8_cublas
from omni.layers.fp8 import quantize_blocks
from omni.layers.fp8_gemm import quantized_activations, reference_matmul


def test_its_activation_rounding_is_the_triton_kernels():
    x = torch.randn(7, 384) * torch.logspace(-3, 2, 384)  # groups of very different scales
    q, s = fp8_cublas.quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (7, 3) and s.stride() == (1, 7)  # column-major scales
    got = (q.float().reshape(7, 3, 128) * s[..., None]).reshape(7, 384)
    torch.testing.assert_close(got, quantized_activations(x), rtol=0, atol=0)


def test_one_row_has_the_outer_major_scale_strides_cublas_checks():
    _, s = fp8_cublas.quantize_rows(torch.randn(1, 256))
    assert s.shape == (1, 2) and s.stride() == (1, 1)


def test_rows_are_padded_to_what_cublas_takes():
    assert [fp8_cublas.padded_rows(m) for m in (1, 15, 16, 17, 64, 300)] == [16, 16, 16, 20, 64, 300]


def test_partial_blocks_never_reach_cublas():
    w, scale = quantize_blocks(torch.randn(96, 128))  # N = 96: not whole 128-blocks
    assert fp8_cublas.linear_or_none(torch.randn(2, 128), w, scale) is None


def test_the_weight_scales_are_padded_to_four_k_blocks_and_transposed():
    scale = torch.arange(6.0).reshape(2, 3)
    got = fp8_cublas._weight_scales(scale)
    assert got.shape == (4, 2) and torch.equal(got[:3], scale.t()) and not got[3].any()


def test_the_choice_can_be_forced_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.setenv("OMNI_FP8_GEMM", "triton")
    assert fp8_cublas.usable(torch.device("cuda", 0)) is False  # never probed
    monkeypatch.setenv("OMNI_FP8_GEMM", "cuBLAS!")
    with pytest.raises(ValueError, match="auto, triton or cublas"):
        fp8_cublas.usable(torch.device("cuda", 0))


@pytest.mark.gpu
@pytest.mark.parametrize("rows,n,k", [(1, 4096, 2048), (16, 2048, 4096), (64, 5120, 2048), (300, 512, 2048)])
def test_cublas_fp8_equals_the_reference_maths_on_the_gpu(rows, n, k):
    assert fp8_cublas.usable(torch.device("cuda")), fp8_cublas._probed
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=gen)
    w, scale = quantize_blocks(torch.randn(n, k, generator=gen) * 0.02)
    x = x.bfloat16()  # the reference rounds the same bf16 activations (bf16 then e4m3 rounds differently)
    want = reference_matmul(x.float(), w, scale)
    got = fp8_cublas.cublas_fp8_linear(x.cuda(), w.cuda(), scale.cuda()).float().cpu()
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()  # cuBLAS's accumulation: ~1 % of peak (H200)
