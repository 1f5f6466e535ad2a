"""BigVGAN's anti-aliased Snake (upsample 2x, SnakeBeta, downsample 2x) as one kernel (on CUDA, with
`fused_ops` on).

Eagerly one activation is ~15 kernels: two replicate pads, the depthwise transposed convolution that
upsamples (cuDNN runs it as a grouped direct dgrad kernel: ~0.9 ms a call on 16 windows on an H200,
16 % of token2wav's GPU time at c=16 on its own, bench/RESULTS.md 2026-12-04), SnakeBeta's six
elementwise ops and the depthwise strided convolution that downsamples; BigVGAN has 109 of them.
Here one program computes a run of outputs of one (item, channel) row straight from the input:

    up[m]  = 2 sum_q x[clamp(n // 2 - q - pad_up, 0, T - 1)] * f_up[n % 2 + 2 q],   n = m + crop_left
    out[t] = sum_j f_down[j] * snake(up[clamp(2 t + j - pad_down, 0, 2 T - 1)])

(the replicate pads become clamped indices), in float32. No host syncs (graph-safe). On a CPU it runs
only in triton's interpreter (tests).
"""

from __future__ import annotations

import torch

from omni.layers import fused_ops

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None

BLOCK_T = 256


def enabled(x: torch.Tensor) -> bool:
    return fused_ops.enabled(x) and x.dtype == torch.float32


if triton is not None:

    @triton.jit
    def _alias_free_snake_kernel(x_ptr, alpha_ptr, inv_beta_ptr, up_ptr, down_ptr, out_ptr, channels, frames,
                                 stride_n, stride_c, PAD_UP: tl.constexpr, CROP: tl.constexpr,
                                 PAD_DOWN: tl.constexpr, TAPS: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        c = row % channels
        src = x_ptr + (row // channels) * stride_n + c * stride_c
        t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        live = t < frames
        alpha = tl.load(alpha_ptr + c)
        inv_beta = tl.load(inv_beta_ptr + c)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for j in tl.static_range(TAPS):
            m = tl.minimum(tl.maximum(2 * t + j - PAD_DOWN, 0), 2 * frames - 1)  # the down pad, replicated
            n = m + CROP
            up = tl.zeros([BLOCK], dtype=tl.float32)
            for q in tl.static_range(TAPS // 2):
                k = tl.minimum(tl.maximum(n // 2 - q - PAD_UP, 0), frames - 1)  # the up pad, replicated
                w = tl.load(up_ptr + (n % 2) + 2 * q)
                up += tl.load(src + k, mask=live, other=0.0) * w
            up = 2.0 * up
            s = tl.sin(up * alpha)
            acc += tl.load(down_ptr + j) * (up + inv_beta * (s * s))
        tl.store(out_ptr + row * frames + t, acc, mask=live)


def alias_free_snake(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor, up_filter: torch.Tensor,
                     down_filter: torch.Tensor, pad_up: int, crop: int, pad_down: int) -> torch.Tensor:
    """x [N, C, T] float32 (time contiguous); alpha = exp(SnakeBeta.alpha), inv_beta = 1 / (exp(beta) + 1e-9),
    both [C]; the 2x filters [taps] -> [N, C, T], as `AliasFreeSnake` computes it."""
    n, c, t = x.shape
    taps = up_filter.numel()
    if x.stride(2) != 1 or down_filter.numel() != taps or alpha.shape != (c,) or inv_beta.shape != (c,) or taps % 2:
        raise fused_ops.FusedOpsInputError(f"alias_free_snake: x {tuple(x.shape)}, filters {taps} taps")
    out = torch.empty(n, c, t, dtype=torch.float32, device=x.device)
    if n * c * t:
        grid = (n * c, triton.cdiv(t, BLOCK_T))
        _alias_free_snake_kernel[grid](x, alpha.contiguous(), inv_beta.contiguous(), up_filter.reshape(-1).contiguous(),
                                       down_filter.reshape(-1).contiguous(), out, c, t, x.stride(0), x.stride(1),
                                       PAD_UP=pad_up, CROP=crop, PAD_DOWN=pad_down, TAPS=taps, BLOCK=BLOCK_T,
                                       num_warps=4)
    return out
