"""The registry of stage kinds, model families and their CLI commands, filled by the families.

Every family registers itself with one call, `register(registry)`: omni's own are the subpackages
of `omni.models` (found by `discover`, each `__init__.py` defining `register`), plugins expose it as
an `omni.plugins` entry point. Entries are `module:attr` strings, resolved only when used, so the
kernel stays free of torch and a stage process imports only what it runs.
"""

from __future__ import annotations

import copy
import importlib
import logging
import pkgutil
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

log = logging.getLogger("omni.registry")

@dataclass
class FamilyEntry:
    """`target`: "module:function", function(model_dir, variant, **options) -> (Graph, ModelInfo)."""
    name: str
    target: str
    architectures: list[str] = field(default_factory=list)
    provider: str = "omni"
    tasks: list[str] = field(default_factory=list)  # what it serves: "chat", "speech", "transcribe"
    voices: list[str] = field(default_factory=list)

    def describe(self) -> str:
        extras = [", ".join(self.tasks)] if self.tasks else []
        extras += [f"voices {', '.join(self.voices)}"] if self.voices else []
        return f"family:{self.name}" + (f" ({'; '.join(extras)})" if extras else "")


@dataclass
class CommandEntry:
    """`omnid NAME ARGS...` runs `target(argv)` (argv: the args after NAME); it returns an exit code or None."""
    name: str
    target: str
    help: str = ""
    provider: str = "omni"


@dataclass
class DefaultEntry:
    """A model `omnid serve` serves when no --model is given: `target(cache_dir) -> model dir | None`."""
    family: str
    target: str
    beside: bool = False  # served next to the main default (when target finds one), not instead of it


@dataclass
class PluginReport:
    name: str
    ok: bool
    provides: list[str] = field(default_factory=list)
    error: str = ""


def resolve(target: str) -> Any:
    """Import `module:attr` (attr may be dotted)."""
    module_name, _, attr = target.partition(":")
    if not attr:
        raise ValueError(f"expected 'module:attr', got {target!r}")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry:
    _TABLES = ("stage_kinds", "stage_args", "families", "commands", "tiny_writers", "defaults")  # rolled back on error

    def __init__(self) -> None:
        self.stage_kinds: dict[str, str] = {}
        self.stage_args: dict[str, str] = {}  # kind -> "module:ArgsClass" (torch-free); absent: free-form args
        self.families: dict[str, FamilyEntry] = {}
        self.commands: dict[str, CommandEntry] = {}  # omnid subcommands families add
        self.tiny_writers: dict[str, str] = {}  # family -> "module:main" of `omnid make-tiny FAMILY DIR [flags]`
        self.defaults: list[DefaultEntry] = []  # the embedded default models (at most one not `beside`)
        self.plugins: list[PluginReport] = []
        self.family_errors: dict[str, str] = {}  # omni's own family package -> why its register failed
        self.plugins_loaded = False
        self._provider, self._provided = "omni", []  # who is registering now, and what it registered

    def register_stage(self, kind: str, target: str, args: str | None = None) -> None:
        """`args`: the kind's typed arguments, a dataclass in a torch-free module (see
        omni/stages/args.py); without it the kind takes free-form dict args, unchecked."""
        self.stage_kinds[kind] = target
        if args:
            self.stage_args[kind] = args
        self._provided.append(f"stage:{kind}")

    def register_family(self, name: str, target: str, architectures: list[str] | tuple[str, ...] = (), *,
                        tasks: list[str] | tuple[str, ...] = (), voices: list[str] | tuple[str, ...] = ()) -> None:
        entry = self.families[name] = FamilyEntry(name, target, list(architectures), self._provider, list(tasks),
                                                  list(voices))
        self._provided.append(entry.describe())

    def register_command(self, name: str, target: str, help: str = "") -> None:
        """`omnid NAME ...` calls `target(argv)`, e.g. a family's checkpoint converter."""
        self.commands[name] = CommandEntry(name, target, help, self._provider)
        self._provided.append(f"command:{name}")

    def register_tiny(self, family: str, target: str) -> None:
        """`omnid make-tiny FAMILY DIR [flags]` calls `target([DIR, flags...])`, which parses its own flags."""
        self.tiny_writers[family] = target
        self._provided.append(f"make-tiny:{family}")

    def register_default(self, family: str, target: str, *, beside: bool = False) -> None:
        """What `omnid serve` without --model serves: `target(cache_dir)` returns the family's model dir
        (None: not available here). One main default; `beside` ones are served next to it."""
        main = self.default_model()
        if not beside and main is not None and main.family != family:
            raise ValueError(f"family {main.family!r} is already the default model; {family!r} cannot be too")
        self.defaults = [d for d in self.defaults if (d.family, d.beside) != (family, beside)]
        self.defaults.append(DefaultEntry(family, target, beside))
        self._provided.append(f"default:{family}" + (" (beside)" if beside else ""))

    def default_model(self) -> DefaultEntry | None:
        return next((d for d in self.defaults if not d.beside), None)

    def stage_class(self, kind: str) -> Any:
        """A stage kind is a registered name or a `module:factory` string."""
        target = self._target(kind)
        if ":" not in target:
            raise ValueError(f"unknown stage kind {kind!r}; registered: {sorted(self.stage_kinds)}")
        return resolve(target)

    def stage_args_class(self, kind: str) -> type | None:
        """The args class of a kind (a registered name, or the `module:Class` it is registered as),
        or None for a kind that takes free-form args."""
        self._target(kind)
        names = [kind] + [name for name, target in self.stage_kinds.items() if target == kind]
        target = next((self.stage_args[n] for n in names if n in self.stage_args), None)
        return resolve(target) if target else None

    def _target(self, kind: str) -> str:
        """An unknown kind name loads the plugins first: a stage process starts with omni's own only."""
        if kind not in self.stage_kinds and ":" not in kind and not self.plugins_loaded:
            self.load_plugins()
        return self.stage_kinds.get(kind, kind)

    def family_for(self, architectures: list[str] | None = None, name: str | None = None) -> FamilyEntry:
        if name:
            if name in self.families:
                return self.families[name]
            raise ValueError(f"unknown model family {name!r}; known: {sorted(self.families)}")
        for entry in self.families.values():
            if set(entry.architectures) & set(architectures or ()):
                return entry
        raise ValueError(f"no model family serves architectures {architectures}; known: "
                         f"{ {n: e.architectures for n, e in self.families.items()} }")

    def discover(self, package: str = "omni.models") -> None:
        """Register every subpackage of `package` that defines `register` (omni's own families).
        A family that fails is logged and kept in `family_errors`, the others still load."""
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
            name = f"{package}.{info.name}"
            if info.ispkg and (error := self._run_register("omni", lambda: getattr(importlib.import_module(name),
                                                                                   "register", None))):
                log.warning("model family %s failed to register: %s", name, error)
                self.family_errors[name] = error

    def load_plugins(self, group: str = "omni.plugins") -> list[PluginReport]:
        """Run every installed plugin's entry point; a broken one is reported, never fatal."""
        self.plugins, self.plugins_loaded = [], True
        for ep in metadata.entry_points(group=group):
            if error := self._run_register(ep.name, ep.load):
                log.warning("plugin %s failed to load: %s", ep.name, error)
            self.plugins.append(PluginReport(ep.name, not error, [] if error else list(self._provided), error))
        self._provided = []
        return self.plugins

    def _run_register(self, provider: str, load) -> str:
        """Call the `register` that `load()` returns (None: not a family, skipped); an error is
        returned, never raised, and nothing of that family stays half-registered."""
        self._provider, self._provided = provider, []
        saved = {name: copy.copy(getattr(self, name)) for name in self._TABLES}
        try:
            if (register := load()) is not None:
                register(self)
        except Exception as exc:  # a family's bug must not stop the others
            vars(self).update(saved)
            return f"{type(exc).__name__}: {exc}"
        finally:
            self._provider = "omni"
        return ""


REGISTRY = Registry()
REGISTRY.discover()  # omni's own families: omni/models/<family>/__init__.py
