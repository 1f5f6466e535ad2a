"""omnid's configuration: one reader of TOML / YAML config files and the stage overrides they and
`--set stage.field=value` flags make on a family's graph.

Values are typed (numbers stay numbers); an unknown stage or field is a GraphError naming it; the
graph is validated after the overrides, so a kind's typed args reject unknown or mistyped fields.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import msgspec

from omni.kernel.errors import GraphError
from omni.kernel.graph import Graph, StageSpec

_STAGE_FIELDS = {f.name for f in dataclasses.fields(StageSpec)} - {"name"}
_FIELD_TYPES = typing.get_type_hints(StageSpec)


def parse_value(text: str) -> Any:
    """`--set` values are typed: JSON literals (numbers, true/false, lists, objects) or plain strings."""
    try:
        return json.loads(text)
    except ValueError:
        return text.lower() == "true" if text.lower() in ("true", "false") else text


def _set_field(graph: Graph, stage_name: str, path: list[str], value: Any) -> None:
    spec = graph.stage(stage_name)
    head = path[0]
    if head == "args":
        if len(path) == 1:
            if not isinstance(value, dict):
                raise GraphError(f"{stage_name}.args must be a table/object")
            spec.args.update(value)
            return
        target = spec.args
        for key in path[1:-1]:
            target = target.setdefault(key, {})
        target[path[-1]] = value
        return
    if head not in _STAGE_FIELDS or len(path) != 1:
        raise GraphError(f"unknown field {'.'.join(path)!r} of stage {stage_name!r}; "
                         f"fields: {sorted(_STAGE_FIELDS)} or args.<key>")
    try:
        setattr(spec, head, msgspec.convert(value, _FIELD_TYPES[head]))
    except msgspec.ValidationError as exc:
        raise GraphError(f"{stage_name}.{head}: {exc}, got {value!r}") from None


def apply_overrides(graph: Graph, overrides: dict[str, dict[str, Any]]) -> Graph:
    """Apply `{stage: {field: value}}`; `args` values merge into the stage's args."""
    for stage_name, fields in overrides.items():
        if not isinstance(fields, dict):
            raise GraphError(f"override for stage {stage_name!r} must be a table of fields")
        for key, value in fields.items():
            _set_field(graph, stage_name, key.split("."), value)
    graph.validate()
    return graph


def parse_set_flags(flags: list[str]) -> dict[str, dict[str, Any]]:
    """Turn `["thinker.replicas=2", "talker.args.block_size=32"]` into an overrides table."""
    table: dict[str, dict[str, Any]] = {}
    for flag in flags:
        key, sep, raw = flag.partition("=")
        stage_name, dot, field_path = key.strip().partition(".")
        if not sep or not dot or not field_path:
            raise GraphError(f"--set expects stage.field=value, got {flag!r}")
        table.setdefault(stage_name, {})[field_path] = parse_value(raw.strip())
    return table


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A TOML or YAML config file (by suffix) as a table: omnid's one reader of them."""
    path = Path(path)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text) or {}
    else:
        import tomllib

        data = tomllib.loads(text)
    if not isinstance(data, dict) or set(data) - {"model", "stages"}:
        raise GraphError(f"{path}: a config file has only a [model] table and [stages.<name>] tables, "
                         f"got {sorted(data) if isinstance(data, dict) else type(data).__name__}")
    return data


def load_override_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read `[stages.<name>]` tables from a TOML or YAML file."""
    stages = read_config_file(path).get("stages", {})
    if not isinstance(stages, dict):
        raise GraphError(f"{path}: 'stages' must be a table of stage tables")
    return stages
