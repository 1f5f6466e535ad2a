"""The registry of stage kinds and model families, filled by omni itself and by plugins.

Entries are `module:attr` strings, resolved only when used, so the kernel stays free of torch
and a stage process imports only what it runs. Plugins expose an `omni.plugins` entry point:
a callable that receives this module's `Registry` and registers what it provides.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

log = logging.getLogger("omni.registry")


@dataclass
class ModelInfo:
    """What the API needs to know of a served model."""

    id: str
    family: str
    speaks: bool = False
    transcribes: bool = False
    voices: list[str] = field(default_factory=list)
    sample_rate: int = 24000
    random_weights: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    max_context: int | None = None  # prompt tokens the model takes; longer prompts are refused up front


# A token covers at most this many characters of ordinary text, so a prompt of more than
# max_context * CHARS_PER_TOKEN characters cannot fit: refused before it is tokenized.
CHARS_PER_TOKEN = 16


@dataclass
class FamilyEntry:
    name: str
    target: str  # "module:function" -> function(model_dir, variant, **options) -> (Graph, ModelInfo)
    architectures: list[str] = field(default_factory=list)
    provider: str = "omni"
    tasks: list[str] = field(default_factory=list)  # what it serves: "chat", "speech", "transcribe"
    voices: list[str] = field(default_factory=list)

    def describe(self) -> str:
        extras = [", ".join(self.tasks)] if self.tasks else []
        extras += [f"voices {', '.join(self.voices)}"] if self.voices else []
        return f"family:{self.name}" + (f" ({'; '.join(extras)})" if extras else "")


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
    def __init__(self) -> None:
        self.stage_kinds: dict[str, str] = {}
        self.stage_args: dict[str, str] = {}  # kind -> "module:ArgsClass" (torch-free); absent: free-form args
        self.families: dict[str, FamilyEntry] = {}
        self.plugins: list[PluginReport] = []
        self._current_provider = "omni"
        self._provided: list[str] = []  # what the plugin being loaded registered
        self.plugins_loaded = False

    def register_stage(self, kind: str, target: str, args: str | None = None) -> None:
        """`args`: the kind's typed arguments, a dataclass in a torch-free module (see
        omni/stages/args.py); without it the kind takes free-form dict args, unchecked."""
        self.stage_kinds[kind] = target
        if args:
            self.stage_args[kind] = args
        self._provided.append(f"stage:{kind}")

    def register_family(self, name: str, target: str, architectures: list[str] | tuple[str, ...] = (), *,
                        tasks: list[str] | tuple[str, ...] = (), voices: list[str] | tuple[str, ...] = ()) -> None:
        entry = FamilyEntry(name, target, list(architectures), self._current_provider, list(tasks), list(voices))
        self.families[name] = entry
        self._provided.append(entry.describe())

    def stage_class(self, kind: str) -> Any:
        """A stage kind is a registered name or a `module:factory` string. An unknown name loads the
        plugins first: a stage process starts with only omni's own kinds registered."""
        if kind not in self.stage_kinds and ":" not in kind and not self.plugins_loaded:
            self.load_plugins()
        target = self.stage_kinds.get(kind, kind)
        if ":" not in target:
            raise ValueError(f"unknown stage kind {kind!r}; registered: {sorted(self.stage_kinds)}")
        return resolve(target)

    def stage_args_class(self, kind: str) -> type | None:
        """The args class of a kind (a registered name, or the `module:Class` it is registered as),
        or None for a kind that takes free-form args."""
        if kind not in self.stage_kinds and ":" not in kind and not self.plugins_loaded:
            self.load_plugins()
        names = [kind] + [name for name, target in self.stage_kinds.items() if target == kind]
        target = next((self.stage_args[n] for n in names if n in self.stage_args), None)
        return resolve(target) if target else None

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

    def load_plugins(self, group: str = "omni.plugins") -> list[PluginReport]:
        """Run every installed plugin's entry point; a broken one is reported, never fatal."""
        self.plugins = []
        self.plugins_loaded = True
        for ep in metadata.entry_points(group=group):
            self._current_provider, self._provided = ep.name, []
            stages, args, families = dict(self.stage_kinds), dict(self.stage_args), dict(self.families)
            try:
                ep.load()(self)
            except Exception as exc:  # a plugin's bug must not stop the others
                log.warning("plugin %s failed to load: %s: %s", ep.name, type(exc).__name__, exc)
                self.stage_kinds, self.stage_args, self.families = stages, args, families  # nothing of it stays half-registered
                self.plugins.append(PluginReport(ep.name, False, error=f"{type(exc).__name__}: {exc}"))
                continue
            finally:
                self._current_provider = "omni"
            self.plugins.append(PluginReport(ep.name, True, list(self._provided)))
        self._provided = []
        return self.plugins


REGISTRY = Registry()

# omni's own stage kinds and families
for _kind, _target in {
    "demo.encoder": "omni.stages.demo:ToyEncoder",
    "demo.generator": "omni.stages.demo:ToyGenerator",
    "demo.vocoder": "omni.stages.demo:ToyVocoder",
}.items():
    REGISTRY.register_stage(_kind, _target)
REGISTRY.register_family("demo", "omni.stages.demo:build_demo", ["OmniDemo"])
REGISTRY.register_family("qwen3-omni", "omni.models.qwen3_omni.graph:build", ["Qwen3OmniMoeForConditionalGeneration"])
REGISTRY.register_family("whisper", "omni.models.whisper.graph:build", ["WhisperForConditionalGeneration"], tasks=["transcribe"])
for _family in ("qwen3_omni", "whisper"):  # until the families register themselves (h15f): their stage kinds
    importlib.import_module(f"omni.models.{_family}.stages").register_stages(REGISTRY)
