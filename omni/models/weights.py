"""Loading weights from a Hugging Face checkpoint directory (safetensors, memory-mapped).

A checkpoint is either one `model.safetensors` or shards named by `model.safetensors.index.json`.
Each part of a model loads only its own prefix (e.g. `code2wav.`), so a stage never reads
the tensors of another stage; safetensors maps the files, so untouched shards cost nothing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

from omni.kernel.errors import OmniError
from omni.layers.fp8_format import QuantizationError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PROGRESS_MIN_BYTES = 256 << 20  # show a progress bar for loads above this size


class CheckpointError(OmniError):
    """The checkpoint directory is missing files or tensors, or a tensor has the wrong shape."""

    kind = "checkpoint"


def checkpoint_files(ckpt_dir: str | Path) -> dict[str, Path]:
    """Map every tensor name in the checkpoint to the safetensors file that holds it."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist")
    index = root / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"{index} is not a valid safetensors index: {exc}") from exc
        files = {name: root / shard for name, shard in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not shard.is_file():
                raise CheckpointError(f"shard {shard.name} named by {index} is missing")
        return files
    single = root / SINGLE_FILE
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as f:
            return {name: single for name in f.keys()}
    raise CheckpointError(f"{root} has neither {SINGLE_FILE} nor {INDEX_FILE}")


def tensor_names(ckpt_dir: str | Path, prefix: str = "") -> list[str]:
    """Names under `prefix` (prefix stripped), sorted."""
    dotted = _dotted(prefix)
    return sorted(n[len(dotted):] for n in checkpoint_files(ckpt_dir) if n.startswith(dotted))


def load_state_dict(
    ckpt_dir: str | Path,
    prefix: str = "",
    device: str = "cpu",
    dtype=None,
    expect: Iterable[str] | None = None,
    progress: bool | None = None,
    fp8: bool = False,
) -> dict:
    """Every tensor whose name starts with `prefix.`, keyed by the rest of its name.

    `dtype` casts floating tensors only; `expect` names keys (prefix stripped) that must be
    present. Raises CheckpointError when the prefix matches nothing or keys are missing.
    FP8 tensors (e4m3 weights, `*.weight_scale_inv` block scales) come back as they are with
    `fp8=True` (for `omni.layers.fp8.resolve_state`); otherwise they are refused
    (QuantizationError): cast to `dtype` they would be raw values up to 448, their scales dropped.
    """
    from safetensors import safe_open

    files = checkpoint_files(ckpt_dir)
    dotted = _dotted(prefix)
    wanted = {n: f for n, f in files.items() if n.startswith(dotted)}
    if not wanted:
        raise CheckpointError(f"no tensor in {ckpt_dir} starts with {dotted!r}")
    if expect is not None:
        missing = sorted(set(expect) - {n[len(dotted):] for n in wanted})
        if missing:
            raise CheckpointError(f"{ckpt_dir}: missing tensors under {dotted!r}: {_few(missing)}")
    by_file: dict[Path, list[str]] = {}
    for name, path in wanted.items():
        by_file.setdefault(path, []).append(name)
    bar = _progress_bar(by_file, wanted, progress)
    out = {}
    try:
        for path, names in sorted(by_file.items()):
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in sorted(names):
                    tensor = f.get_tensor(name)
                    if _is_fp8(name, tensor):
                        if not fp8:
                            raise QuantizationError(f"{ckpt_dir}: {name} is FP8 ({tensor.dtype}) but the part "
                                                    f"under {dotted!r} cannot load FP8 weights")
                    elif dtype is not None and tensor.is_floating_point():
                        tensor = tensor.to(dtype)
                    out[name[len(dotted):]] = tensor.to(device) if device != "cpu" else tensor
                    if bar is not None:
                        bar.update(tensor.numel() * tensor.element_size())
    finally:
        if bar is not None:
            bar.close()
    return out


def load_into(
    module, ckpt_dir: str | Path, prefix: str, dtype=None, device: str = "cpu", allow_unused: bool = False
) -> None:
    """Fill `module`'s parameters and persistent buffers from `prefix`; every one must be present
    with its exact shape, and (unless `allow_unused`) no tensor under the prefix may be left over.
    The module comes back in eval mode without gradients (weights to serve). FP8 pairs (e4m3 + block
    scales, as a checkpoint's config declares) are dequantized to `dtype` (the parts that run FP8
    kernels, the thinker and talker decoders, load them their own way)."""
    want = module.state_dict()
    state = load_state_dict(ckpt_dir, prefix, device=device, dtype=dtype, expect=want.keys(), fp8=True)
    if any(_is_fp8(name, t) for name, t in state.items()):
        from omni.layers.fp8 import resolve_state

        state = resolve_state(state, _declared_fp8(ckpt_dir), dtype, keep_fp8=False, where=f"{ckpt_dir} ({prefix})")
    unused = sorted(set(state) - set(want))
    state = {k: v for k, v in state.items() if k in want}
    if unused and not allow_unused:
        raise CheckpointError(f"{ckpt_dir}: tensors under {prefix!r} that the module lacks: {_few(unused)}")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(want[name].shape):
            raise CheckpointError(
                f"{prefix}.{name}: checkpoint shape {tuple(tensor.shape)} != module {tuple(want[name].shape)}"
            )
    module.load_state_dict(state, strict=True, assign=True)
    module.eval().requires_grad_(False)


def load_module(make, ckpt_dir: str | Path, prefix: str, dtype=None, device: str = "cpu"):
    """`make()` built on `device` (no host copy), then filled from `prefix` by `load_into`."""
    import torch

    with torch.device(device):
        module = make()
    load_into(module, ckpt_dir, prefix, dtype=dtype, device=device)
    return module


def load_weights(module, tensors, prefix: str) -> None:
    """Copy `tensors[prefix + name]` into every parameter of `module`.

    `tensors` is any mapping from checkpoint names to tensors (a state dict or a lazy
    safetensors view). Routed experts are accepted fused (`experts.gate_up_proj`, as
    transformers holds them) or per expert (`experts.{e}.gate_proj.weight`, as checkpoints
    store them).
    """
    import torch

    for name, param in module.named_parameters():
        key = prefix + name
        if key in tensors:
            value = tensors[key]
        elif name.endswith(_STACKED):
            value = _stack_experts(tensors, key, param.shape[0])
        else:
            raise CheckpointError(f"checkpoint has no weight {key!r}")
        if tuple(value.shape) != tuple(param.shape):
            raise CheckpointError(f"weight {key!r} has shape {tuple(value.shape)}, expected {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(value.to(param.dtype))


_STACKED = ("experts.gate_up_proj", "experts.down_proj", "experts.gate_up_proj_scale_inv", "experts.down_proj_scale_inv")


def _stack_experts(tensors, key: str, num_experts: int):
    """Per-expert tensors stacked as the fused parameter `key` (FP8 block scales too: `_scale_inv`)."""
    import torch

    base, last = key.rsplit(".", 1)  # "...mlp.experts", "gate_up_proj[_scale_inv]"
    weight = "weight_scale_inv" if last.endswith("_scale_inv") else "weight"
    try:
        if last.startswith("gate_up_proj"):
            return torch.stack(
                [torch.cat((tensors[f"{base}.{e}.gate_proj.{weight}"], tensors[f"{base}.{e}.up_proj.{weight}"]), 0)
                 for e in range(num_experts)]
            )
        return torch.stack([tensors[f"{base}.{e}.down_proj.{weight}"] for e in range(num_experts)])
    except KeyError as exc:
        raise CheckpointError(f"checkpoint has no weight {key!r} nor its per-expert form ({exc})") from None


def _declared_fp8(ckpt_dir: str | Path):
    """The FP8 format config.json declares (None without one; QuantizationError for one omni cannot honour)."""
    from omni.layers.fp8_format import checkpoint_format

    path = Path(ckpt_dir) / "config.json"
    return checkpoint_format(json.loads(path.read_text()), str(path)) if path.is_file() else None


def _is_fp8(name: str, tensor) -> bool:
    import torch

    return name.endswith("_scale_inv") or tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def _dotted(prefix: str) -> str:
    return prefix.rstrip(".") + "." if prefix else ""


def _few(names: list[str], limit: int = 8) -> str:
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _progress_bar(by_file, wanted, progress: bool | None):
    """A tqdm bar on stderr, by bytes, for large loads (or when asked)."""
    if progress is False:
        return None
    from safetensors import safe_open

    total = 0
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt") as f:
            for name in names:
                sl = f.get_slice(name)
                total += _numel(sl.get_shape()) * _dtype_size(sl.get_dtype())
    if progress is None and total < PROGRESS_MIN_BYTES:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="B", unit_scale=True, desc="loading weights", file=sys.stderr)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


_DTYPE_SIZES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
                "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _dtype_size(name: str) -> int:
    return _DTYPE_SIZES.get(name, 4)


def thinker_token_rows(ckpt_dir: str | Path, token_ids: tuple[int, ...]):
    """Rows [len(token_ids), H] (float32) of an omni checkpoint's thinker input embedding table, read
    without loading the whole table (what a talker needs of it: its text tokens' embeddings)."""
    import torch
    from safetensors import safe_open

    name = "thinker.model.embed_tokens.weight"
    files = checkpoint_files(ckpt_dir)
    if name not in files:
        raise CheckpointError(f"{ckpt_dir}: no {name} (the talker needs its text tokens' embeddings)")
    with safe_open(str(files[name]), framework="pt") as f:
        table = f.get_slice(name)
        vocab = table.get_shape()[0]
        for t in token_ids:
            if not 0 <= t < vocab:
                raise CheckpointError(f"token id {t} outside the thinker vocabulary of {vocab}")
        return torch.cat([table[t : t + 1] for t in token_ids]).float()
