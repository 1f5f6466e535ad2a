"""A stage's model part: random weights (`load_format="random"`) or the checkpoint's.

Every part class has `from_checkpoint(model_dir, dtype=..., device=...)`; a family that can
draw random weights of the same shapes passes its builder as `random(args, device)`. A model dir
without weights says so with `omni_random.json` (a family's full-size presets write it); its graph
gives every model stage `random_stage_args`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omni.models.weights import CheckpointError
from omni.stages.args import LOAD_FORMATS


RANDOM_MARKER = "omni_random.json"  # next to a config.json without weights: every stage draws its own


def random_marker(where: str | Path) -> dict[str, Any] | None:
    """The marker's contents when `where` is a config-only (random-weight) model dir, else None."""
    path = Path(where) / RANDOM_MARKER
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return {"random_weights": True, "load_format": "random"}


def random_stage_args(marker: dict[str, Any] | None) -> dict[str, Any]:
    """The args that make a model stage draw its weights, for a dir with `marker` (none without one)."""
    return {"load_format": "random", "seed": int(marker.get("seed", 0))} if marker else {}


def arg(args: Any, name: str) -> Any:
    """One field of a stage's args: its typed args (WeightArgs, as the stage receives them) or a
    plain mapping (a part loaded by hand); None when absent."""
    return args.get(name) if isinstance(args, Mapping) else getattr(args, name, None)


def load_format(args: Any) -> str:
    """The stage's `load_format` arg ("auto" when absent); a typed error for an unknown one."""
    fmt = str(arg(args, "load_format") or "auto")
    if fmt not in LOAD_FORMATS:
        raise CheckpointError(f"load_format {fmt!r} is not one of {LOAD_FORMATS}")
    return fmt


def model_dir(args: Any) -> str | None:
    """The checkpoint directory the args name (`model_dir`, or `model` when it is a path)."""
    found = arg(args, "model_dir") or arg(args, "model")
    return found if isinstance(found, str) else None


def random_dir(part: str, args: Any) -> str | None:
    """The model dir whose config `part` draws its random weights from, or None when its args do not
    say `load_format="random"`; a typed error when they name no model dir."""
    if load_format(args) != "random":
        return None
    where = model_dir(args)
    if where is None:
        raise CheckpointError(f"{part}: load_format='random' needs a model_dir with a config.json")
    return where


def load_part(cls, args: Any, device, random: Callable[[Any, Any], Any] | None = None,
              default_dtype: str | None = None):
    """`random(args, device)` when the args say `load_format="random"`, else `cls.from_checkpoint`
    of the args' model dir in the args' `dtype` (a torch dtype name; else `default_dtype`; else
    the class's own default), with the args' `quantization` when set."""
    if load_format(args) == "random":
        if random is None:
            raise CheckpointError(f"{cls.__name__}: load_format='random' is not supported")
        return random(args, device)
    where = model_dir(args)
    if where is None:
        raise CheckpointError(f"{cls.__name__}: the stage args name no model_dir")
    import torch

    name = arg(args, "dtype") or default_dtype
    kwargs = {"dtype": getattr(torch, name)} if name else {}
    if arg(args, "quantization"):  # the parts that take one (the thinker's and talker's `quantization`)
        kwargs["quantization"] = arg(args, "quantization")
    return cls.from_checkpoint(where, device=device, **kwargs)
