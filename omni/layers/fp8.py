"""Block-scaled e4m3 weights (the format of `fp8_format`): quantize, dequantize, and a checkpoint
state dict's FP8 tensors made ready for the decoders that load it.

Why one place: the same rounding must serve the tiny-checkpoint writer, quantize-at-load
(`--quantization fp8`), the random full-size FP8 model and the CPU path, which dequantizes
(weights = e4m3 * per-block scale_inv) so that a CPU run computes on exactly the weights an FP8
GPU run holds. Scales: one float32 per 128x128 block, amax / 448 (blocks of zeros get 1).
"""

from __future__ import annotations

import logging
import re

import torch

from omni.layers.fp8_format import BLOCK, Fp8Format, QuantizationError

E4M3 = torch.float8_e4m3fn
log = logging.getLogger("omni.fp8")
E4M3_MAX = 448.0
SCALE_SUFFIX = "_scale_inv"  # `X.weight` -> `X.weight_scale_inv`; stacked experts `gate_up_proj_scale_inv`

# The decoder linears omni runs in FP8 (thinker and talker layers, dense and experts, checkpoint
# names): attention q/k/v/o, MLP and shared-expert gate/up/down, each routed expert. Routers
# (`mlp.gate`), the shared-expert gate, embeddings, heads, norms and the code predictor stay bf16.
FP8_LINEAR = re.compile(
    r"(^|\.)layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj|mlp\.experts\.\d+\.(gate|up|down)_proj"
    r"|mlp\.shared_expert\.(gate|up|down)_proj)\.weight$")
_NOT_DECODER = ("code_predictor.", "audio_tower.", "visual.", "code2wav.")
# What an FP8 Qwen3-Omni checkpoint written by omni keeps in bf16 (its `modules_to_not_convert`), as
# the community FP8 Qwen3-Omni checkpoints do: routers, embeddings, heads, norms (never linears), the
# encoders, the code predictor and code2wav, the talker's projections and shared-expert gate.
KEPT_BF16 = ("lm_head", "embed_tokens", "mlp.gate", "mlp.shared_expert_gate", "codec_head", "codec_embedding",
             "text_projection", "hidden_projection", "code_predictor", "audio_tower", "visual", "code2wav")


def runs_fp8_linear(name: str) -> bool:
    """Whether checkpoint weight `name` is one omni's FP8 kernels run (else it is dequantized)."""
    return bool(FP8_LINEAR.search(name)) and not any(p in name for p in _NOT_DECODER)


def device_runs_fp8(device) -> bool:
    """FP8 kernels need a CUDA GPU with FP8 tensor cores (SM 8.9+) and triton; elsewhere FP8
    checkpoints are dequantized at load."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def _blocks(shape: tuple[int, ...], block=BLOCK) -> tuple[int, int]:
    return -(-shape[-2] // block[0]), -(-shape[-1] // block[1])


def quantize_blocks(w: torch.Tensor, block=BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """`w` [..., N, K] -> (e4m3 [..., N, K], float32 scale_inv [..., ceil(N/bn), ceil(K/bk)]),
    w ~= e4m3 * scale_inv per block; partial edge blocks are scaled by their own amax."""
    bn, bk = block
    nb, kb = _blocks(w.shape, block)
    n, k = w.shape[-2:]
    x = w.float()
    padded = torch.nn.functional.pad(x, (0, kb * bk - k, 0, nb * bn - n))
    tiles = padded.reshape(*w.shape[:-2], nb, bn, kb, bk)
    amax = tiles.abs().amax(dim=(-3, -1))
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (tiles / scale[..., :, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    q = q.reshape(*w.shape[:-2], nb * bn, kb * bk)[..., :n, :k].contiguous()
    return q, scale.contiguous()


def expand_scales(scale: torch.Tensor, n: int, k: int, block=BLOCK) -> torch.Tensor:
    """Per-block scales [..., nb, kb] spread to per-element [..., n, k]."""
    full = scale.repeat_interleave(block[0], dim=-2).repeat_interleave(block[1], dim=-1)
    return full[..., :n, :k]


def dequantize_blocks(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32, block=BLOCK) -> torch.Tensor:
    """e4m3 [..., N, K] and scale_inv [..., nb, kb] -> weights in `dtype` (float32 products)."""
    nb, kb = _blocks(q.shape, block)
    if tuple(scale.shape[-2:]) != (nb, kb) or scale.shape[:-2] != q.shape[:-2]:
        raise QuantizationError(f"FP8 scale_inv of shape {tuple(scale.shape)} does not fit weights "
                                f"{tuple(q.shape)} in {block[0]}x{block[1]} blocks")
    w = q.float() * expand_scales(scale.float(), q.shape[-2], q.shape[-1], block)
    return w.to(dtype)


def fits_blocks(shape: tuple[int, ...], block=BLOCK) -> bool:
    """The FP8 kernels take whole blocks only (every Qwen3-Omni decoder linear has them)."""
    return shape[-2] % block[0] == 0 and shape[-1] % block[1] == 0


def resolve_state(state: dict[str, torch.Tensor], checkpoint: Fp8Format | None, dtype, keep_fp8: bool,
                  where: str = "checkpoint") -> dict[str, torch.Tensor]:
    """A loaded state dict with its FP8 pairs (`X.weight` e4m3 + `X.weight_scale_inv`) kept for the FP8
    kernels (`keep_fp8`, for `runs_fp8_linear` weights of whole blocks) or dequantized to `dtype`;
    QuantizationError for an e4m3 tensor without a scale, a scale without its weight, or FP8
    tensors the config does not declare."""
    scales = [n for n in state if n.endswith(SCALE_SUFFIX)]
    if scales and checkpoint is None:
        raise QuantizationError(f"{where}: has FP8 block scales ({scales[0]}, ...) but its config declares no "
                                "quantization_config")
    out = dict(state)
    kept = 0
    for name in scales:
        base = name[: -len(SCALE_SUFFIX)]
        q = out.get(base)
        if q is None or q.dtype != E4M3:
            raise QuantizationError(f"{where}: {name} scales {base}, which is "
                                    f"{'missing' if q is None else q.dtype} (FP8 weights are e4m3)")
        block = checkpoint.block if checkpoint else BLOCK
        if keep_fp8 and runs_fp8_linear(base) and fits_blocks(q.shape, block):
            kept += 1
            continue
        out[base] = dequantize_blocks(q, out.pop(name), dtype or torch.float32, block)
    bare = [n for n, t in out.items() if t.dtype == E4M3 and n + SCALE_SUFFIX not in out]
    if bare:
        raise QuantizationError(f"{where}: e4m3 tensors without a weight_scale_inv: {bare[:4]}")
    if scales:
        log.info("%s: %d FP8 weights kept e4m3, %d dequantized", where, kept, len(scales) - kept)
    return out
