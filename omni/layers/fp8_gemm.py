"""The block-scaled FP8 GEMM of the dense decoder linears, in Triton: y = x W^T with W e4m3 in
128x128 blocks (`fp8.quantize_blocks`) and x quantized on the fly, per token and group of 128.

On CUDA `fp8_linear` takes cuBLAS's block-scaled FP8 instead where a probe shows it usable
(fp8_cublas.py: torch's `scaled_mm` with 1x128 / 128x128 scales, SM90); this kernel is the fallback
and the reference on other GPUs. Here each K step
loads an x tile [BLOCK_M, 128] in its own dtype, takes the row amax (scale_a = amax / 448),
casts x / scale_a to e4m3 in registers, runs one e4m3 x e4m3 tensor-core dot and adds it into the
float32 accumulator times scale_a (per row) * scale_w (per 128 columns). No activation buffer, no
host sync (CUDA graphs capture it). Decode rows on narrow layers split K over more programs (float32
slices summed after: two small launches) so that every SM streams weights. Off CUDA the weights are dequantized and
the matmul is torch's (the CPU path dequantizes at load anyway; this is for tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from omni import env
from omni.layers.fp8 import E4M3, E4M3_MAX, dequantize_blocks

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None

GROUP = 128  # activation group = weight block along K
ACT_EPS = 1e-10  # floor of a group's amax (all-zero groups)


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 4
    split_k: int = 0  # 0: chosen per launch (`split_k`); must divide K / 128


# (max rows, config): decode rows read weights once, so narrow N tiles spread them over every SM.
CONFIGS: tuple[tuple[int, GemmConfig], ...] = (
    (16, GemmConfig(16, 32)),
    (64, GemmConfig(32, 64)),
    (256, GemmConfig(64, 64, num_stages=3)),
    (1 << 62, GemmConfig(128, 128, num_warps=8, num_stages=3)),
)


def pick_config(rows: int) -> GemmConfig:
    return next(cfg for limit, cfg in CONFIGS if rows <= limit)


if triton is not None:

    @triton.jit
    def quant_group(a, ACT_FP8: tl.constexpr):
        """A [rows, 128] float32 tile -> (its per-row e4m3 values, per-row scale): scale = amax / 448.
        ACT_FP8=False keeps x / scale in float32 (the CPU interpreter's float8 casts round wrongly
        at binade edges, so there only the scale logic is checked)."""
        scale = tl.maximum(tl.max(tl.abs(a), 1), 1e-10) / 448.0
        q = tl.clamp(a / scale[:, None], -448.0, 448.0)
        if ACT_FP8:
            q = q.to(tl.float8e4nv)
        return q, scale

    @triton.jit
    def scaled_dot(q, w, ACT_FP8: tl.constexpr):
        """e4m3 x e4m3 on the tensor cores, or float32 (IEEE) for the interpreter's check."""
        if ACT_FP8:
            part = tl.dot(q, w)
        else:
            part = tl.dot(q, w.to(tl.float32), input_precision="ieee")
        return part

    @triton.jit(do_not_specialize=["M"])
    def _block_fp8_gemm(
        x_ptr, w_ptr, s_ptr, out_ptr, M, stride_xm, stride_wn, stride_sn, stride_om,
        N: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACT_FP8: tl.constexpr,
        SPLIT_K: tl.constexpr = 1,
    ):
        """SPLIT_K > 1: program (.., .., s) sums K blocks [s * KB/SPLIT_K, (s + 1) * KB/SPLIT_K) into its own
        float32 slice out[s] (the caller sums the slices): decode rows on narrow layers (k/v: 512 columns)
        would otherwise leave most SMs idle."""
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        split = tl.program_id(2)
        k = tl.arange(0, 128)
        m_ok, n_ok = m < M, n < N
        per: tl.constexpr = K // 128 // SPLIT_K
        first = split * per
        a_ptrs = x_ptr + m[:, None].to(tl.int64) * stride_xm + first * 128 + k[None, :]
        b_ptrs = w_ptr + n[None, :].to(tl.int64) * stride_wn + first * 128 + k[:, None]
        s_ptrs = s_ptr + (n // 128) * stride_sn + first
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for kb in range(0, per):
            a = tl.load(a_ptrs, mask=m_ok[:, None], other=0.0).to(tl.float32)
            b = tl.load(b_ptrs, mask=n_ok[None, :], other=0.0)
            q, scale_a = quant_group(a, ACT_FP8)
            scale_b = tl.load(s_ptrs + kb, mask=n_ok, other=0.0)
            acc += scaled_dot(q, b, ACT_FP8) * (scale_a[:, None] * scale_b[None, :])
            a_ptrs += 128
            b_ptrs += 128
        out = out_ptr + split.to(tl.int64) * M * stride_om + m[:, None].to(tl.int64) * stride_om + n[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


TARGET_PROGRAMS = 256  # about two per SM of an H100/H200: below it, split K (decode rows, narrow layers)


def split_k(rows: int, n: int, k: int, cfg: GemmConfig) -> int:
    """The K split for this launch: the largest divisor of the K blocks that brings the grid up to
    TARGET_PROGRAMS (1 when the M x N tiles already fill it)."""
    tiles = -(-rows // cfg.block_m) * -(-n // cfg.block_n)
    want, blocks = max(1, TARGET_PROGRAMS // tiles), k // GROUP
    return max(d for d in range(1, blocks + 1) if blocks % d == 0 and d <= want)


class Fp8GemmError(ValueError):
    """Shapes or dtypes the FP8 GEMM does not take."""


def _check(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> None:
    n, k = weight.shape
    if x.shape[-1] != k:
        raise Fp8GemmError(f"x [..., {x.shape[-1]}] does not fit weights [{n}, {k}]")
    if n % GROUP or k % GROUP:
        raise Fp8GemmError(f"FP8 weights [{n}, {k}] are not whole {GROUP}x{GROUP} blocks")
    if tuple(scale.shape) != (n // GROUP, k // GROUP) or scale.dtype != torch.float32:
        raise Fp8GemmError(f"scale_inv {tuple(scale.shape)} {scale.dtype}, want ({n // GROUP}, {k // GROUP}) float32")
    if weight.stride(-1) != 1 or scale.stride(-1) != 1:
        raise Fp8GemmError("FP8 weights and scales must be contiguous in their last dimension")


def block_fp8_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, act_fp8: bool = True,
                     config: GemmConfig | None = None) -> torch.Tensor:
    """The Triton kernel: `x` [..., K] (bf16/fp16/fp32) times e4m3 `weight` [N, K] with float32
    `scale` [N/128, K/128] -> [..., N] in x's dtype. `act_fp8=False`: float32 activations (the
    interpreter check; see `quant_group`)."""
    _check(x, weight, scale)
    if triton is None:
        raise RuntimeError("triton is not installed")
    lead, k = x.shape[:-1], x.shape[-1]
    n = weight.shape[0]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if rows:
        cfg = config or pick_config(rows)
        split = cfg.split_k or split_k(rows, n, k, cfg)
        if (k // GROUP) % split:
            raise Fp8GemmError(f"split_k {split} does not divide the {k // GROUP} K blocks")
        dest = out if split == 1 else torch.empty(split, rows, n, dtype=torch.float32, device=x.device)
        grid = (triton.cdiv(rows, cfg.block_m), triton.cdiv(n, cfg.block_n), split)
        _block_fp8_gemm[grid](x2, weight, scale, dest, rows, x2.stride(0), weight.stride(0), scale.stride(0),
                              n, N=n, K=k, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, ACT_FP8=act_fp8,
                              SPLIT_K=split, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        if split > 1:
            out.copy_(dest.sum(0))
    return out.reshape(*lead, n)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """y = x W^T for block-FP8 W: on CUDA cuBLAS's block-scaled FP8 where usable, else the Triton
    kernel; elsewhere x times the dequantized W."""
    if x.is_cuda:
        from omni.layers import fp8_cublas

        if fp8_cublas.usable(x.device):
            y = fp8_cublas.linear_or_none(x, weight, scale)
            if y is not None:
                return y
    if x.is_cuda and triton is not None:
        return block_fp8_matmul(x, weight, scale)
    if env.triton_interpret() and triton is not None:
        return block_fp8_matmul(x, weight, scale, act_fp8=False)
    return F.linear(x, dequantize_blocks(weight, scale, x.dtype))


def quantized_activations(x: torch.Tensor) -> torch.Tensor:
    """float32 x as the kernels see it: per row and 128-group, e4m3 of x / (amax / 448), times that scale."""
    k = x.shape[-1]
    a = x.float().reshape(-1, k // GROUP, GROUP)
    s = a.abs().amax(-1, keepdim=True).clamp_min(ACT_EPS) / E4M3_MAX
    return ((a / s).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).float() * s).reshape(x.shape)


def reference_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, quantize_act: bool = True
                     ) -> torch.Tensor:
    """float32 torch reference of the kernel's maths (tests): x quantized as the kernel does
    (`quantize_act`, `quantized_activations`), times the dequantized weights."""
    a = quantized_activations(x) if quantize_act else x.float()
    return a @ dequantize_blocks(weight, scale, torch.float32).T
