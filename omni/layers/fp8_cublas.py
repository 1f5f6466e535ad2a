"""The dense FP8 GEMM through cuBLAS's block-scaled FP8 (`torch.nn.functional.scaled_mm` with
DeepSeek-style scaling: activations 1x128, weights 128x128), beside the Triton kernel (fp8_gemm.py).

Why: the Triton kernel measured 3-5x slower than cuBLAS bf16 on the thinker's dense shapes
(bench/RESULTS.md, FP8's GPU part), while torch (2.9+) reaches cuBLAS's own block-scaled kernels on
SM90. The scale layouts cuBLAS wants are easy to get wrong and only a GPU can tell, so each device
is probed once, eagerly, before first use: a small product against the kernels' float32 reference
maths (`fp8_gemm.reference_matmul`). Where the probe fails (another GPU, an older torch, a layout it
refuses) the Triton kernel serves and the reason is logged. `OMNI_FP8_GEMM` = triton | cublas | auto
(default) picks by hand (the benchmark's A/B).
"""

from __future__ import annotations

import logging

import torch

from omni import env

GROUP = 128
E4M3_MAX = 448.0
ACT_EPS = 1e-10
log = logging.getLogger("omni.fp8")
_probed: dict[int, str | None] = {}  # device index -> None (usable) or why not
_shapes: dict[tuple[int, int, int], bool] = {}  # (padded M, N, K) -> whether cuBLAS took it (tried eagerly once)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> e4m3 [M, K] and its float32 dequant scales [M, K/128] per row and group of 128, in
    the column-major layout cuBLAS reads (the same rounding as the Triton kernel's, `quantized_activations`)."""
    m, k = x.shape
    a = x.float().reshape(m, k // GROUP, GROUP)
    s = a.abs().amax(-1).clamp_min(ACT_EPS) / E4M3_MAX
    q = (a / s[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).reshape(m, k)
    outer_major = torch.empty_strided(s.shape, (1, m), dtype=s.dtype, device=s.device)  # strides (1, M), M = 1 too
    return q, outer_major.copy_(s)


def _weight_scales(scale: torch.Tensor) -> torch.Tensor:
    """[N/128, K/128] block scales as cuBLAS reads 128x128 ones: K blocks padded to a multiple of 4,
    then transposed (a view)."""
    kb = scale.shape[1]
    pad = -kb % 4
    if pad:
        scale = torch.nn.functional.pad(scale, (0, pad))
    return scale.t()


def cublas_fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """y = x W^T, x [..., K] bf16/fp16/fp32, W e4m3 [N, K], scale [N/128, K/128]: -> [..., N] in x's dtype."""
    from torch.nn.functional import ScalingType, scaled_mm

    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k)
    m = rows.shape[0]
    pad = padded_rows(m) - m
    if pad:  # zero rows: their scale is the floor, their outputs are dropped
        rows = torch.nn.functional.pad(rows, (0, 0, 0, pad))
    q, s = quantize_rows(rows)
    out_dtype = x.dtype if x.dtype in (torch.bfloat16, torch.float32) else torch.bfloat16
    y = scaled_mm(q, weight.t(), s, ScalingType.BlockWise1x128, _weight_scales(scale), ScalingType.BlockWise128x128,
                  output_dtype=out_dtype)
    return y[:m].to(x.dtype).reshape(*lead, weight.shape[0])


def padded_rows(m: int) -> int:
    """The row count cuBLAS is given: at least 16 and a multiple of 4 (the H200 refused M = 1 with
    CUBLAS_STATUS_NOT_SUPPORTED and took 16, 64 and 300)."""
    return max(16, -(-m // 4) * 4)


def linear_or_none(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor | None:
    """`cublas_fp8_linear` where cuBLAS takes this weight's shape, else None (the caller's Triton
    kernel serves). cuBLAS refuses some shapes (CUBLAS_STATUS_NOT_SUPPORTED): each (M, N, K) is tried
    once eagerly; a shape first met inside a graph capture is not tried there (an error would end
    the capture) and takes the Triton kernel (a capture's warm-up runs its shapes eagerly first)."""
    n, k = weight.shape
    if n % GROUP or k % GROUP:
        return None  # partial blocks: the block-scaled layouts cover whole 128-blocks only
    key = (padded_rows(x.numel() // k), n, k)
    known = _shapes.get(key)
    if known is False or (known is None and torch.cuda.is_current_stream_capturing()):
        return None
    if known:
        return cublas_fp8_linear(x, weight, scale)
    try:
        y = cublas_fp8_linear(x, weight, scale)
    except RuntimeError as exc:
        log.warning("FP8 GEMM %s: the Triton kernel (cuBLAS refused it: %s)", key, str(exc).splitlines()[0][:160])
        _shapes[key] = False
        return None
    _shapes[key] = True
    return y


def usable(device: torch.device) -> bool:
    """Whether this device's FP8 dense GEMMs go through cuBLAS (probed once, eagerly; see the module)."""
    choice = env.fp8_gemm()
    if choice == "triton":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _probed:
        if torch.cuda.is_current_stream_capturing():
            return False  # never probe inside a capture (it syncs); the next eager call does
        _probed[index] = _probe(torch.device("cuda", index))
        if _probed[index] is None:
            log.info("FP8 dense GEMMs on cuda:%d: cuBLAS block-scaled (scaled_mm)", index)
        else:
            log.warning("FP8 dense GEMMs on cuda:%d: the Triton kernel (cuBLAS block-scaled FP8 not usable: %s)",
                        index, _probed[index])
    if _probed[index] is not None and choice == "cublas":
        raise RuntimeError(f"OMNI_FP8_GEMM=cublas, but cuBLAS block-scaled FP8 is not usable: {_probed[index]}")
    return _probed[index] is None


def _probe(device: torch.device) -> str | None:
    from omni.layers.fp8 import quantize_blocks
    from omni.layers.fp8_gemm import reference_matmul

    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        # groups and blocks of very different scales, so that a scale read from the wrong block shows
        x = (torch.randn(48, 384, generator=gen) * torch.logspace(-2, 1, 3).repeat_interleave(GROUP)).bfloat16()
        w = torch.randn(256, 384, generator=gen) * torch.logspace(-3, 0, 6).reshape(2, 1, 3, 1).expand(2, 128, 3, 128).reshape(256, 384)
        w, scale = quantize_blocks(w)
        want = reference_matmul(x.float(), w, scale)  # from the same bf16 activations
        got = cublas_fp8_linear(x.to(device), w.to(device), scale.to(device)).float().cpu()
        err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
        # a scale read from the wrong block is off by 10-1000x here; cuBLAS's own rounding measured 1.05 % (H200)
        return None if err <= 2e-2 else f"probe differs from the reference by {err:.3g} of its peak"
    except Exception as exc:  # an older torch, a GPU without block-scaled FP8, a refused layout
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
