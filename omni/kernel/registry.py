"""Stage kinds by name: the one table the kernel reads to build a stage and check its args.

A kind is a registered name or a `module:factory` string. Entries are `module:attr` strings,
resolved only when used, so the kernel stays free of torch and a stage process imports only what
it runs. The families fill the table through the model registry (omni/models/registry.py), which
also loads the plugins when a name is not known yet (`on_unknown`); a stage process gets the
entries of its graph's kinds from omnid (`entries_for`, `add`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def resolve(target: str) -> Any:
    """Import `module:attr` (attr may be dotted)."""
    module_name, _, attr = target.partition(":")
    if not attr:
        raise ValueError(f"expected 'module:attr', got {target!r}")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class StageKinds:
    def __init__(self) -> None:
        self.stage_kinds: dict[str, str] = {}
        self.stage_args: dict[str, str] = {}  # kind -> "module:ArgsClass" (torch-free); absent: free-form args
        self.aliases: dict[str, str] = {}  # a kind's former name -> its name ("qwen3_tts_talker" -> "qwen3-tts.talker")
        self.on_unknown: Callable[[], Any] | None = None  # called before an unknown name is refused

    def register_stage(self, kind: str, target: str, args: str | None = None) -> None:
        """`args`: the kind's typed arguments, a StageArgs dataclass in a torch-free module (see
        omni/stages/args.py); without it the kind takes free-form dict args, unchecked."""
        self.stage_kinds[kind] = target
        if args:
            self.stage_args[kind] = args

    def register_alias(self, alias: str, kind: str) -> None:
        """`alias` (a kind's former name, which configs may still use) names `kind`."""
        self.aliases[alias] = kind

    def kind_of(self, kind: str) -> str:
        """The registered name of `kind` (itself unless it is an alias)."""
        if kind not in self.stage_kinds and kind not in self.aliases and ":" not in kind and self.on_unknown:
            self.on_unknown()
        return self.aliases.get(kind, kind)

    def stage_class(self, kind: str) -> Any:
        target = self._target(kind)
        if ":" not in target:
            raise ValueError(f"unknown stage kind {kind!r}; registered: {sorted(self.stage_kinds)}")
        return resolve(target)

    def stage_args_class(self, kind: str) -> type | None:
        """The args class of a kind (a registered name, or the `module:Class` it is registered as),
        or None for a kind that takes free-form args."""
        self._target(kind)
        target = next((self.stage_args[n] for n in self._names(kind) if n in self.stage_args), None)
        return resolve(target) if target else None

    def entries_for(self, kinds: list[str]) -> dict[str, dict[str, str]]:
        """What a stage process needs of this table to build `kinds` (its `add` takes it)."""
        names = {name for kind in kinds for name in self._names(kind)}
        return {"kinds": {n: t for n, t in self.stage_kinds.items() if n in names},
                "args": {n: a for n, a in self.stage_args.items() if n in names},
                "aliases": {a: k for a, k in self.aliases.items() if a in kinds}}

    def add(self, entries: dict[str, dict[str, str]]) -> None:
        self.stage_kinds.update(entries.get("kinds", {}))
        self.stage_args.update(entries.get("args", {}))
        self.aliases.update(entries.get("aliases", {}))

    def _names(self, kind: str) -> list[str]:
        kind = self.aliases.get(kind, kind)
        return [kind] + [name for name, target in self.stage_kinds.items() if target == kind]

    def _target(self, kind: str) -> str:
        kind = self.kind_of(kind)
        return self.stage_kinds.get(kind, kind)


STAGES = StageKinds()  # the kernel's: what this process's stages are built from
