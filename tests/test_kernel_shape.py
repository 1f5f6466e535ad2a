"""The kernel stays small and light: it imports neither torch nor aiohttp, it stays within its line
budget, and its messages name edges by integer id."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from omni.kernel import messages as m
from omni.kernel.graph import EdgeSpec
from omni.models.demo.stages import demo_graph

KERNEL_DIR = Path(__file__).resolve().parent.parent / "omni" / "kernel"
# #15, #27: the kernel in one sitting, under 1,300 lines of code, counted as cloc counts them (blank
# lines, comments and docstrings apart); its physical lines are held where they are too. What is not
# the kernel's own lives beside it: the payload channels (omni/transport/channels.py), the request's
# sampling contract (omni/sampling.py), the model registry (omni/models/registry.py), and the stage
# process and the hosts that run replicas, library mode's in-process tasks included (omni/cluster).
CODE_LINE_BUDGET = 1300
PHYSICAL_LINE_BUDGET = 1850


def test_kernel_imports_neither_torch_nor_aiohttp():
    """Nor does the stage process's entry point (omni/cluster/proc.py), which imports the actor."""
    modules = sorted(f"omni.kernel.{p.stem}" for p in KERNEL_DIR.glob("*.py") if p.stem != "__init__")
    assert "omni.kernel.kernel" in modules and "omni.kernel.actor" in modules
    modules.append("omni.cluster.proc")
    code = (f"import importlib, sys\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
            "print(sorted({'torch', 'aiohttp'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_kernel_imports_no_family_stage_or_api_module():
    """The kernel depends on nothing above it: the families fill its stage-kind table from above."""
    modules = sorted(f"omni.kernel.{p.stem}" for p in KERNEL_DIR.glob("*.py") if p.stem != "__init__")
    code = (f"import importlib, sys\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
            "print(sorted(n for n in sys.modules if n.split('.')[:2] in (['omni', 'models'], ['omni', 'stages'],"
            " ['omni', 'api'])))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def code_lines(source: str) -> int:
    """Lines that are neither blank, nor a comment, nor part of a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    return sum(1 for n, line in enumerate(source.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and n not in docstrings)


def test_code_lines_skip_blanks_comments_and_docstrings():
    source = 'def f():\n    """Doc,\n    two lines."""\n\n    # a comment\n    return 1  # kept\n'
    assert code_lines(source) == 2


def test_kernel_stays_within_its_line_budget():
    sources = {p.name: p.read_text() for p in KERNEL_DIR.glob("*.py")}
    code = {name: code_lines(text) for name, text in sources.items()}
    physical = {name: len(text.splitlines()) for name, text in sources.items()}
    assert sum(code.values()) < CODE_LINE_BUDGET, sorted(code.items(), key=lambda kv: -kv[1])
    assert sum(physical.values()) < PHYSICAL_LINE_BUDGET, sorted(physical.items(), key=lambda kv: -kv[1])


def test_edges_are_named_by_integer_id():
    graph = demo_graph()
    assert set(graph.exits()) == {i for i, e in enumerate(graph.edges) if e.dst == "$out"}
    assert all(graph.edges[i].src == "generator" for i in graph.outgoing("generator"))
    chunk = m.decode(m.encode(m.RequestChunk("r", 2, {"x": 1})))
    assert chunk.edge == 2
    with pytest.raises(msgspec.ValidationError):
        m.decode(m.encode(m.RequestChunk("r", "generator.text->$out.text", {"x": 1})))


def test_an_edge_added_later_feeds_its_port():
    graph = demo_graph()
    graph.edges.append(EdgeSpec("generator", "text", "vocoder"))
    edge_id = len(graph.edges) - 1
    assert graph.edges[edge_id].dst_port == "text" and edge_id in graph.incoming("vocoder")
    assert str(graph.edges[edge_id]) == "generator.text->vocoder.text"
