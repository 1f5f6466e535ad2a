"""The model registry: the families, their CLI commands, tiny writers and default models, and
what a family's graph builder tells the API about the model it serves (ModelInfo).

Every family registers itself with one call, `register(registry)`: omni's own are the subpackages
of `omni.models` (found by `discover`, each `__init__.py` defining `register`), plugins expose it as
an `omni.plugins` entry point. Entries are `module:attr` strings, resolved only when used. The stage
kinds a family registers go to the kernel's table (omni/kernel/registry.py), which asks this
registry to load the plugins when a stage kind's name is not known yet.
"""

from __future__ import annotations

import copy
import importlib
import logging
import pkgutil
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from omni.kernel.registry import STAGES, StageKinds, resolve
from omni.layers.chat_template import CHARS_PER_TOKEN

__all__ = ["CHARS_PER_TOKEN", "REGISTRY", "ModelInfo", "Registry", "resolve"]

log = logging.getLogger("omni.registry")



@dataclass
class ModelInfo:
    """What the API needs to know of a served model: each capability is a typed field with a default
    (a family sets only what its model does). There is no free-form bag: a graph builder that still
    passes `extra=` (a plugin written against an older omni) fails with a TypeError when it builds."""
    id: str
    family: str
    speaks: bool = False
    transcribes: bool = False
    voices: list[str] = field(default_factory=list)
    sample_rate: int = 24000
    random_weights: bool = False
    max_context: int | None = None  # prompt tokens the model takes; longer prompts are refused up front
    sampling_stage: str | None = None  # the stage whose sampling a request's top-level fields set (None: none)
    model_dir: str | None = None  # its checkpoint (uploaded voices are kept per checkpoint's files)
    tasks: tuple[str, ...] = ("chat",)  # what it serves: "chat", "speech", "transcribe", "translate"
    # chat
    completions: bool = False  # also continues raw text (/v1/completions: its entry stage takes "complete")
    logprobs: bool = False  # reports token log-probabilities
    audio_input: bool = False  # hears audio itself (else a served transcriber transcribes it for realtime)
    default_max_tokens: int | None = None  # the answer length it stops at when a request sets none
    # transcription
    word_timestamps: bool = False  # times words (timestamp_granularities[]=word)
    no_translation_reason: str = ""  # why it does not translate, told when no served model does
    # speech
    instructions: bool | None = None  # takes `instructions` (True), refuses them with a 400 (False), ignores them (None)
    applies_speed: bool = False  # applies `speed` itself (else the API resamples its audio)
    designs_voices: bool = False  # its voice is described in `instructions`, not named (Qwen3-TTS VoiceDesign)
    clones_voices: bool = False  # speaks in uploaded voices (/v1/audio/voices)
    speaker_sample_rate: int | None = None  # the rate a voice upload is resampled to (None: 24 kHz)
    openai_voices: dict[str, str] = field(default_factory=dict)  # OpenAI voice name -> its speaker (config.json)
    audio_window: dict[str, int] | None = None  # its audio encoder's window {"samples", "lead"}: Realtime encodes turns by it


def check_info(graph: Any, info: ModelInfo) -> None:
    """What ModelInfo says of its graph holds: the stage a request's top-level sampling goes to is
    one of the graph's (checked, where it was agreed by hand)."""
    names = [spec.name for spec in graph.stages]
    if info.sampling_stage is not None and info.sampling_stage not in names:
        raise ValueError(f"model {info.id!r}: sampling_stage {info.sampling_stage!r} is not a stage of its graph "
                         f"{names}")


@dataclass
class FamilyEntry:
    """`target`: "module:function", function(model_dir, variant, **options) -> (Graph, ModelInfo).
    `settle`: "module:function", function(graph, info), run again once config files and `--set` have
    changed the graph: what follows from one stage's final args into another's and into ModelInfo."""
    name: str
    target: str
    architectures: list[str] = field(default_factory=list)
    provider: str = "omni"
    tasks: list[str] = field(default_factory=list)  # what it serves: "chat", "speech", "transcribe"
    voices: list[str] = field(default_factory=list)
    settle: str = ""

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


class Registry:
    """What `register(registry)` fills. Its stage kinds live in `stages`, the kernel's table for
    omni's REGISTRY (a fresh Registry, as tests make, has a table of its own)."""

    _TABLES = ("stage_kinds", "stage_args", "stage_aliases", "families", "commands", "tiny_writers", "defaults")  # rolled back on error

    def __init__(self, stages: StageKinds | None = None) -> None:
        self.stages = StageKinds() if stages is None else stages
        self.stages.on_unknown = self._load_plugins_once  # a stage process starts with omni's own only
        self.families: dict[str, FamilyEntry] = {}
        self.commands: dict[str, CommandEntry] = {}  # omnid subcommands families add
        self.tiny_writers: dict[str, str] = {}  # family -> "module:main" of `omnid make-tiny FAMILY DIR [flags]`
        self.defaults: list[DefaultEntry] = []  # the embedded default models (at most one not `beside`)
        self.plugins: list[PluginReport] = []
        self.family_errors: dict[str, str] = {}  # omni's own family package -> why its register failed
        self.plugins_loaded = False
        self._provider, self._provided = "omni", []  # who is registering now, and what it registered

    # the stage-kind tables live in `stages` (the kernel's StageKinds); here under the names _TABLES rolls back
    stage_kinds = property(lambda self: self.stages.stage_kinds, lambda self, t: setattr(self.stages, "stage_kinds", t))
    stage_args = property(lambda self: self.stages.stage_args, lambda self, t: setattr(self.stages, "stage_args", t))
    stage_aliases = property(lambda self: self.stages.aliases, lambda self, t: setattr(self.stages, "aliases", t))

    def register_stage(self, kind: str, target: str, args: str | None = None, aliases: tuple[str, ...] = ()) -> None:
        """See StageKinds.register_stage: the one call by which a family (omni's or a plugin's)
        adds a stage kind, named "<family>.<stage>"; `aliases`: its former names, still accepted."""
        self.stages.register_stage(kind, target, args)
        for alias in aliases:
            self.stages.register_alias(alias, kind)
        self._provided.append(f"stage:{kind}")

    def register_family(self, name: str, target: str, architectures: list[str] | tuple[str, ...] = (), *,
                        tasks: list[str] | tuple[str, ...] = (), voices: list[str] | tuple[str, ...] = (),
                        settle: str = "") -> None:
        entry = self.families[name] = FamilyEntry(name, target, list(architectures), self._provider, list(tasks),
                                                  list(voices), settle)
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
        return self.stages.stage_class(kind)

    def stage_args_class(self, kind: str) -> type | None:
        return self.stages.stage_args_class(kind)

    def _load_plugins_once(self) -> None:
        if not self.plugins_loaded:
            self.load_plugins()

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
            for name, table in saved.items():
                setattr(self, name, table)
            return f"{type(exc).__name__}: {exc}"
        finally:
            self._provider = "omni"
        return ""


REGISTRY = Registry(STAGES)
REGISTRY.discover()  # omni's own families: omni/models/<family>/__init__.py
