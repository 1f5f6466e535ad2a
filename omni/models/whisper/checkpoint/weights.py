"""Load a part of a Hugging Face Whisper checkpoint (safetensors, memory-mapped) into a module."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


class WhisperWeightsError(ValueError):
    """Missing, unexpected or mis-shaped tensors (names them)."""


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise WhisperWeightsError(f"{model_dir}: no *.safetensors files")
    return files


def load_into(module: nn.Module, model_dir: str | Path, prefix: str, dtype: torch.dtype, device: str | torch.device,
              optional: tuple[str, ...] = ()) -> None:
    """Copy every tensor named `prefix + <module param name>` into `module` (cast to `dtype`).

    Every parameter must be found except those in `optional`; tensors under `prefix` that the module
    does not have are an error (a checkpoint of another architecture should not load silently).
    """
    from safetensors import safe_open

    wanted = dict(module.named_parameters())
    found: dict[str, torch.Tensor] = {}
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                if not key.startswith(prefix):
                    continue
                name = key[len(prefix):]
                if name not in wanted:
                    raise WhisperWeightsError(f"{path.name}: unexpected tensor {key}")
                found[name] = f.get_tensor(key)
    missing = [n for n in wanted if n not in found and n not in optional]
    if missing:
        raise WhisperWeightsError(f"{model_dir}: missing tensors {[prefix + n for n in missing[:5]]}"
                                  + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    with torch.no_grad():
        for name, tensor in found.items():
            param = wanted[name]
            if tuple(param.shape) != tuple(tensor.shape):
                raise WhisperWeightsError(f"{prefix}{name}: shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
            param.copy_(tensor.to(torch.float32))
    module.to(device=device, dtype=dtype)
    module.eval()
    module.requires_grad_(False)
