"""FP8 Qwen3-Omni checkpoints on disk: a bf16/float32 checkpoint rewritten in the published
fine-grained FP8 format, and the dequantized copy that reference runs load.

Why: `omnid make-tiny qwen3-omni DIR --fp8` and CPU parity tests need FP8 checkpoints of the
exact layout SGLang and vLLM read (every decoder linear of the thinker and talker as
`X.weight` float8_e4m3fn + `X.weight_scale_inv` float32 per 128x128 block, a top-level
`quantization_config`), and transformers needs the same numbers as plain float weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from omni.layers.fp8 import KEPT_BF16, SCALE_SUFFIX, dequantize_blocks, quantize_blocks, runs_fp8_linear
from omni.layers.fp8_format import QUANT_KEY, Fp8Format, checkpoint_format
from omni.models.weights import INDEX_FILE, checkpoint_files

FORMAT = Fp8Format(not_convert=KEPT_BF16)


def _rewrite(ckpt_dir: Path, out_dir: Path, convert) -> None:
    """Every safetensors file of `ckpt_dir` through `convert(tensors) -> tensors`, into `out_dir`."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    files = checkpoint_files(ckpt_dir)
    weight_map, total = {}, 0
    for path in sorted(set(files.values())):
        with safe_open(str(path), framework="pt") as f:
            tensors = convert({name: f.get_tensor(name) for name in f.keys()})
        save_file(tensors, str(out_dir / path.name), metadata={"format": "pt"})
        weight_map.update({name: path.name for name in tensors})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors
    if (ckpt_dir / INDEX_FILE).is_file():
        (out_dir / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                     indent=1))


def _quantize(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in tensors.items():
        module = name.rsplit(".", 1)[0]
        if runs_fp8_linear(name) and FORMAT.converts(module) and t.is_floating_point():
            out[name], out[name + SCALE_SUFFIX] = quantize_blocks(t)
        else:
            out[name] = t
    return out


def write_fp8(ckpt_dir: str | Path) -> Path:
    """Rewrite checkpoint `ckpt_dir` in place as fine-grained FP8 (weights and config.json)."""
    root = Path(ckpt_dir)
    config = json.loads((root / "config.json").read_text())
    if checkpoint_format(config) is not None:
        raise ValueError(f"{root} is FP8 already")
    _rewrite(root, root, _quantize)
    config[QUANT_KEY] = FORMAT.to_config()
    (root / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return root


def write_dequantized(fp8_dir: str | Path, out_dir: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """A copy of FP8 checkpoint `fp8_dir` with every e4m3 pair dequantized to `dtype` and no
    quantization_config: what transformers (or a bf16 run) loads as "the same weights"."""
    import shutil

    src, out = Path(fp8_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file() and not item.name.endswith(".safetensors") and item.name != INDEX_FILE:
            shutil.copy2(item, out / item.name)

    def dequantize(tensors):
        kept = {}
        for name, t in tensors.items():
            if name.endswith(SCALE_SUFFIX):
                continue
            scale = tensors.get(name + SCALE_SUFFIX)
            kept[name] = dequantize_blocks(t, scale, dtype) if scale is not None else t
        return kept

    _rewrite(src, out, dequantize)
    config = json.loads((out / "config.json").read_text())
    config.pop(QUANT_KEY, None)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
