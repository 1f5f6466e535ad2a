"""Families register themselves: the generic layers name none, and a new family folder is found
with no edit elsewhere (its stages, make-tiny writer, commands and embedded default)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from omni.api import cli
from omni.models import registry as registry_module
from omni.models.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
GENERIC = ("omni/kernel", "omni/stages", "omni/api")
FAMILY_WORD = re.compile(r"qwen|whisper|thinker|talker|code2wav", re.IGNORECASE)  # families and their stages
# OpenAI's model names (the API's aliases) are OpenAI's, not a family's.
OPENAI_NAMES = {"whisper-1"}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def family_names_in(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant (docstrings aside), import, identifier, attribute or
    argument that names a family; comments are not code and do not count."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        texts: list[str] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if node.value not in OPENAI_NAMES:
                texts.append(node.value)
        elif isinstance(node, ast.Name):
            texts.append(node.id)
        elif isinstance(node, ast.Attribute):
            texts.append(node.attr)
        elif isinstance(node, ast.arg):
            texts.append(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            texts.append(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            texts.append(node.name)
        elif isinstance(node, ast.Import):
            texts += [a.name for a in node.names] + [a.asname for a in node.names if a.asname]
        elif isinstance(node, ast.ImportFrom):
            texts += [node.module or ""] + [a.name for a in node.names] + [a.asname for a in node.names if a.asname]
        found += [(getattr(node, "lineno", 0), t) for t in texts if FAMILY_WORD.search(t)]
    return found


def test_the_checker_finds_family_names_in_code_not_in_comments_or_docstrings():
    code = textwrap.dedent('''
        """A docstring may say Qwen3-Omni."""
        import omni.models.whisper.graph as g  # a comment may say Whisper
        from omni.models.qwen3_omni import graph
        def f(whisper_dir):
            """So may this one: Whisper."""
            x = "thinker of qwen3-omni"
            return g.build(x, Qwen3Model=1).WhisperConfig, f"{x} as Whisper does", "whisper-1"
    ''')
    found = sorted({text for _, text in family_names_in(code)})
    assert found == [" as Whisper does", "Qwen3Model", "WhisperConfig", "omni.models.qwen3_omni",
                     "omni.models.whisper.graph", "thinker of qwen3-omni", "whisper_dir"]


def test_no_generic_module_names_a_family():
    offenders = []
    for folder in GENERIC:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, text in family_names_in(path.read_text()):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {text!r}")
    assert not offenders, "generic code names a family:\n" + "\n".join(offenders)


def test_the_playground_names_no_family():
    for path in sorted((ROOT / "omni/api/static").glob("*.js")):
        text = path.read_text()
        for name in OPENAI_NAMES:
            text = text.replace(f'"{name}"', '""')
        assert not FAMILY_WORD.search(text), f"{path.relative_to(ROOT)} names a family"


def test_omni_families_register_without_torch():
    """Discovery imports each family's __init__ only: the registry loads with torch and numpy absent."""
    code = ("import json, sys; sys.modules['torch'] = None; sys.modules['numpy'] = None\n"
            "from omni.models.registry import REGISTRY as R\n"
            "print(json.dumps([sorted(R.families), sorted(R.tiny_writers), sorted(R.commands), R.family_errors,\n"
            "                  [(d.family, d.beside) for d in R.defaults], sorted(R.stage_kinds)]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    families, tiny, commands, errors, defaults, kinds = json.loads(out.stdout)
    assert errors == {}
    assert {"demo", "qwen3-omni", "qwen3-tts", "whisper"} <= set(families)
    assert {"qwen3-omni", "qwen3-tts"} <= set(tiny) and "convert-whisper" in commands
    assert [d for d in defaults if not d[1]] == [["qwen3-omni", False]] and ["whisper", True] in defaults
    assert {"demo.encoder", "demo.generator", "demo.vocoder"} <= set(kinds)


def write_family_tree(root: Path) -> str:
    """A package of families as omni/models is: `newfam` (a family with a tiny writer and a
    command), `broken` (raises half-way through register), `helpers` (no register: not a family)."""
    ns = root / "fams_under_test"
    for sub in ("newfam", "broken", "helpers"):
        (ns / sub).mkdir(parents=True)
    (ns / "__init__.py").write_text("")
    (ns / "newfam" / "__init__.py").write_text(textwrap.dedent('''
        def register(registry):
            registry.register_stage("newfam.echo", "fams_under_test.newfam.tiny:Echo")
            registry.register_family("newfam", "fams_under_test.newfam.tiny:build", ["NewFamModel"])
            registry.register_tiny("newfam", "fams_under_test.newfam.tiny:main")
            registry.register_command("newfam-hello", "fams_under_test.newfam.tiny:hello", help="say hello")
    '''))
    (ns / "newfam" / "tiny.py").write_text(textwrap.dedent('''
        import argparse, json, pathlib

        class Echo:
            pass

        def main(argv):
            parser = argparse.ArgumentParser(prog="omnid make-tiny newfam")
            parser.add_argument("out_dir")
            parser.add_argument("--kind", choices=["base", "custom"], default="custom")
            args = parser.parse_args(argv)
            if pathlib.Path(args.out_dir).name == "refuse":
                raise ValueError("this directory is refused")
            out = pathlib.Path(args.out_dir)
            out.mkdir(parents=True)
            (out / "config.json").write_text(json.dumps({"architectures": ["NewFamModel"], "kind": args.kind}))
            return 0

        def hello(argv):
            print("hello", *argv)
            return 3 if argv == ["three"] else 0
    '''))
    (ns / "broken" / "__init__.py").write_text(textwrap.dedent('''
        def register(registry):
            registry.register_stage("broken.half", "fams_under_test.broken:Half")
            registry.register_tiny("broken", "fams_under_test.broken:main")
            raise RuntimeError("this family is deliberately broken")
    '''))
    (ns / "helpers" / "__init__.py").write_text("VALUE = 1\n")
    return "fams_under_test"


@pytest.fixture
def new_family(tmp_path, monkeypatch) -> Registry:
    """A registry as omni's, with the families of a package dropped on the path discovered too."""
    monkeypatch.syspath_prepend(str(tmp_path))
    package = write_family_tree(tmp_path)
    registry = Registry()
    registry.discover()  # omni's own
    registry.discover(package)
    monkeypatch.setattr(registry_module, "REGISTRY", registry)
    monkeypatch.setattr(Registry, "load_plugins", lambda self, group="omni.plugins": [])
    return registry


def test_a_dropped_in_family_registers_itself(new_family):
    assert new_family.family_for(architectures=["NewFamModel"]).name == "newfam"
    assert new_family.stage_class("newfam.echo").__name__ == "Echo"
    assert new_family.tiny_writers["newfam"] == "fams_under_test.newfam.tiny:main"
    assert new_family.commands["newfam-hello"].help == "say hello"
    assert "RuntimeError: this family is deliberately broken" in new_family.family_errors["fams_under_test.broken"]
    assert "broken.half" not in new_family.stage_kinds and "broken" not in new_family.tiny_writers  # rolled back
    assert not any(name.endswith("helpers") for name in new_family.family_errors)
    assert {"qwen3-omni", "whisper", "demo", "newfam"} <= set(new_family.families)


def test_make_tiny_and_commands_of_a_dropped_in_family(new_family, tmp_path, capsys):
    assert cli.main(["make-tiny", "newfam", str(tmp_path / "b"), "--kind", "base"]) == 0
    assert (tmp_path / "b" / "config.json").read_text() == '{"architectures": ["NewFamModel"], "kind": "base"}'
    assert cli.main(["make-tiny", "newfam", str(tmp_path / "c")]) == 0
    assert '"kind": "custom"' in (tmp_path / "c" / "config.json").read_text()
    with pytest.raises(SystemExit) as bad_flag:  # the family's own parser refuses its bad flags
        cli.main(["make-tiny", "newfam", str(tmp_path / "d"), "--kind", "nope"])
    assert bad_flag.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err
    assert cli.main(["make-tiny", "newfam", str(tmp_path / "refuse")]) == 2
    assert "make-tiny failed: this directory is refused" in capsys.readouterr().err
    assert cli.main(["make-tiny", "broken", str(tmp_path / "e")]) == 2
    assert re.search(r"make-tiny knows the families newfam, .*qwen3-omni.*, not 'broken'", capsys.readouterr().err)
    assert cli.main(["newfam-hello", "a", "--b"]) == 0
    assert capsys.readouterr().out == "hello a --b\n"
    assert cli.main(["newfam-hello", "three"]) == 3
    help_text = cli.build_parser().format_help()
    assert "newfam-hello" in help_text and "say hello" in help_text and "convert-whisper" in help_text


def test_one_main_default(new_family):
    with pytest.raises(ValueError, match="'qwen3-omni' is already the default model"):
        new_family.register_default("newfam", "fams_under_test.newfam.tiny:main")
    new_family.register_default("newfam", "fams_under_test.newfam.tiny:main", beside=True)
    assert [(d.family, d.beside) for d in new_family.defaults][-1] == ("newfam", True)


def test_model_info_names_a_stage_of_its_graph():
    """A family's `sampling_stage` must be one of its graph's stages (it was agreed by hand)."""
    from omni.models.demo.graph import build_demo
    from omni.models.registry import check_info

    graph, info = build_demo()
    check_info(graph, info)
    info.sampling_stage = "thinker"
    with pytest.raises(ValueError, match="sampling_stage 'thinker' is not a stage"):
        check_info(graph, info)


def test_former_kind_names_are_accepted_aliases(tmp_path):
    """Kinds are named "<family>.<stage>"; Qwen3-TTS's former names (qwen3_tts_talker, ...) still work in
    a config: a graph naming them validates, reads as the dotted kind (same class, same typed args), and a
    stage process handed the table's entries for them builds them."""
    from omni.kernel.graph import Graph, stage_args
    from omni.kernel.registry import STAGES, StageKinds
    from omni.models.qwen3_tts.checkpoint.make_tiny import make_tiny
    from omni.models.registry import REGISTRY, resolve

    former = {"qwen3_tts_preprocess": "qwen3-tts.preprocess", "qwen3_tts_talker": "qwen3-tts.talker",
              "qwen3_tts_voice": "qwen3-tts.voice", "qwen3_tts_codec": "qwen3-tts.codec"}
    for old, kind in former.items():
        assert STAGES.kind_of(old) == kind and STAGES.kind_of(kind) == kind
        assert STAGES.stage_args_class(old) is STAGES.stage_args_class(kind) is not None
    process = StageKinds()
    process.add(STAGES.entries_for(list(former)))
    assert process.stage_class("qwen3_tts_codec") is STAGES.stage_class("qwen3-tts.codec")

    graph, _ = resolve(REGISTRY.family_for(name="qwen3-tts").target)(str(make_tiny(tmp_path / "tts", kind="base")), None)
    data = graph.to_dict()
    for spec in data["stages"]:
        spec["kind"] = {v: k for k, v in former.items()}[spec["kind"]]
    old = Graph.from_dict(data)
    old.validate()
    assert [s.kind for s in old.stages] == [s.kind for s in graph.stages]
    assert all(stage_args(a) == stage_args(b) for a, b in zip(old.stages, graph.stages))


def test_every_kind_is_named_family_dot_stage():
    """One naming of kinds: "<family>.<stage>" (the family may hold dots and dashes: qwen2.5-omni);
    an alias is a former name and never names a kind that is not registered."""
    from omni.models.registry import REGISTRY

    REGISTRY.load_plugins()
    odd = sorted(k for k in REGISTRY.stage_kinds if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*\.[a-z0-9_]+", k))
    assert not odd, f"kinds not named <family>.<stage>: {odd}"
    assert all(kind in REGISTRY.stage_kinds and alias not in REGISTRY.stage_kinds
               for alias, kind in REGISTRY.stage_aliases.items())
