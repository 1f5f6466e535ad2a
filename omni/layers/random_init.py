"""Random weights for a model part built without a checkpoint (`load_format="random"`): the part is
built on the meta device and its tensors are allocated and drawn directly on the stage's device
(no host copy), from one seeded generator in parameter-name order, so a seed always gives the same
weights on that device. Families build their parts with `randomized` and refill what `to_empty`
leaves uninitialised (rotary tables, filters, ...); `check_materialized` fails loudly if one is missed.

Two draws: `randomize_` (N(0, std), norms 1, biases 0: a deep language model stays in range) and
`fan_in_randomize_` (matrices N(0, 1 / fan_in), vectors small: a vocoder's convolutions stay
audible-scale, as make_tiny's token2wav weights are drawn).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable

import torch
from torch import nn

DEFAULT_STD = 0.02

# torch's default dtype is process-wide: stages setting up at once in one process (inline mode) take turns
_DEFAULT_DTYPE_LOCK = threading.Lock()


@contextlib.contextmanager
def meta(dtype: torch.dtype):
    """Build modules on the meta device in `dtype` (torch's default dtype meanwhile)."""
    with _DEFAULT_DTYPE_LOCK, _default_dtype(dtype), torch.device("meta"):
        yield


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _is_norm(module: nn.Module) -> bool:
    return "Norm" in type(module).__name__


def _generator(device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(int(seed))


@torch.no_grad()
def randomize_(module: nn.Module, device, seed: int = 0, std: float = DEFAULT_STD) -> nn.Module:
    """Allocate `module`'s parameters and buffers on `device` (uninitialised) and draw the parameters."""
    module.to_empty(device=device)
    gen = _generator(device, seed)
    owners = {f"{mod_name}.{p_name}" if mod_name else p_name: mod
              for mod_name, mod in module.named_modules() for p_name, _ in mod.named_parameters(recurse=False)}
    for name, param in sorted(module.named_parameters()):
        if name.endswith("bias"):
            param.zero_()
        elif _is_norm(owners[name]):
            param.fill_(1.0)
        elif param.is_floating_point():
            param.normal_(0.0, std, generator=gen)
    module.requires_grad_(False)
    return module.eval()


@torch.no_grad()
def fan_in_randomize_(module: nn.Module, seed: int = 0, unit: Iterable[str] = (), vector_std: float = 0.1) -> None:
    """Every parameter of `module` (already on its device) from one generator seeded by `seed`:
    matrices ~ N(0, 1 / fan_in) (`unit`: names ending so get N(0, 1), e.g. embeddings), vectors
    ~ N(0, vector_std). On the CPU these are exactly the draws of `torch.randn(shape, generator=g)`."""
    unit = tuple(unit)
    gen = _generator(next(module.parameters()).device, seed)
    for name, p in sorted(module.named_parameters()):
        draw = torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32)
        if p.dim() >= 2:
            fan_in = 1 if name.endswith(unit) else p[0].numel()
            p.copy_(draw / fan_in ** 0.5)
        else:
            p.copy_(vector_std * draw)


def check_materialized(module: nn.Module) -> None:
    """No parameter, buffer or tensor attribute may still be on the meta device."""
    for mod_name, mod in module.named_modules():
        tensors = list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False))
        tensors += [(k, v) for k, v in vars(mod).items() if isinstance(v, torch.Tensor)]
        for name, t in tensors:
            if t.is_meta:
                raise RuntimeError(f"random load left {mod_name + '.' if mod_name else ''}{name} on the meta device")


@contextlib.contextmanager
def randomized(make: Callable[[], nn.Module], device, dtype: torch.dtype, seed: int, std: float = DEFAULT_STD,
               draw: Callable[[nn.Module], None] | None = None):
    """`make()` built on the meta device, its parameters drawn on `device` (`randomize_`, or
    `draw(model)` once allocated there); the body refills the non-parameter tensors (under
    no_grad), then every tensor must be materialized."""
    with meta(dtype):
        model = make()
    if draw is None:
        randomize_(model, device, seed, std)
    else:
        model.to_empty(device=device)
        draw(model)
        model.requires_grad_(False).eval()
    with torch.no_grad():
        yield model
    check_materialized(model)
