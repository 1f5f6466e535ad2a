"""omni's modules import each other without cycles: the graph of top-level imports (read with
`ast`, nothing imported) has no cycle. Function-level imports are collected apart; they may point
back up the graph (a lazy import is how a heavy or optional dependency is put off), but a cycle
among top-level imports makes import order matter and breaks a module imported first."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "omni"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(module: str, is_package: bool, node: ast.AST, modules: set[str]) -> set[str]:
    """The omni modules one import statement names (`from a import b` names a.b when b is a module)."""
    found: set[str] = set()
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = _resolve(module, is_package, node)
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    else:
        return found
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(top-level imports, function-level imports): module -> the omni modules it imports.

    Top level: statements run at import time (the module body, classes, `if`/`try` blocks),
    except under `if TYPE_CHECKING:`. Function level: imports inside a def."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    top: dict[str, set[str]] = {m: set() for m in modules}
    lazy: dict[str, set[str]] = {m: set() for m in modules}

    def visit(module: str, is_package: bool, node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            (lazy if in_function else top)[module] |= _targets(module, is_package, child, modules)
            visit(module, is_package, child, inner)

    for module, path in files.items():
        visit(module, path.name == "__init__.py", ast.parse(path.read_text(), str(path)), False)
    for module in modules:  # importing a.b.c runs a/__init__ and a/b/__init__ first
        parts = module.split(".")
        top[module] |= {".".join(parts[:i]) for i in range(1, len(parts))} & modules - {module}
    return top, lazy


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)):
            return found
    return None


def test_the_graph_reader_sees_both_kinds_of_import():
    top, lazy = import_graph()
    assert "omni.layers.norms" in top["omni.layers.decoder_layer"]
    assert "omni.layers.fused_ops" in top["omni.layers.norms"]
    assert "omni.models.qwen3_omni.modules.thinker" in lazy["omni.models.qwen3_omni.checkpoint.random_load"]
    assert "omni.models.qwen3_omni.modules.thinker" not in top["omni.models.qwen3_omni.checkpoint.random_load"]


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_cycle_among_top_level_imports():
    top, _ = import_graph()
    assert find_cycle(top) is None, f"import cycle: {' -> '.join(find_cycle(top))}"


def test_nothing_the_api_app_imports_imports_it_back():
    """Routes and helpers read the app's state from omni.api.state: only the app imports them."""
    top, lazy = import_graph()
    below, todo = set(), ["omni.api.app"]
    while todo:
        module = todo.pop()
        for nxt in (top[module] | lazy[module]) - below:
            below.add(nxt)
            todo.append(nxt)
    offenders = sorted(m for m in below if "omni.api.app" in top[m] | lazy[m])
    assert not offenders, f"import omni.api.state, not omni.api.app: {offenders}"


def _family(module: str) -> str | None:
    """The family package a module belongs to (omni.models.<family>.…), else None."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["omni", "models"] else None


def test_no_family_imports_another():
    """What two families share lives below them (omni/stages, omni/layers, omni/models' own
    modules): a family imports no other family, at the top level or in a function."""
    top, lazy = import_graph()
    offenders = sorted(f"{m} -> {t}" for m in top for t in top[m] | lazy[m]
                       if _family(m) and _family(t) and _family(m) != _family(t))
    assert not offenders, "a family imports another:\n" + "\n".join(offenders)


def test_stages_and_layers_import_no_model_family():
    """The shared talker, code predictor and codec layers live in omni/stages and omni/layers:
    nothing there imports omni.models (a family or its loaders), lazily or not."""
    top, lazy = import_graph()
    offenders = sorted(f"{m} -> {t}" for m in top for t in top[m] | lazy[m]
                       if m.startswith(("omni.stages", "omni.layers")) and t.startswith("omni.models"))
    assert not offenders, "shared code imports a model family:\n" + "\n".join(offenders)


def test_both_qwen_families_share_one_talker_and_codec():
    """Qwen3-Omni and Qwen3-TTS subclass the same talker, stage and codec decoder bases."""
    top, _ = import_graph()
    for family in ("qwen3_omni", "qwen3_tts"):
        used = set().union(*(t for m, t in top.items() if _family(m) == family))
        assert {"omni.stages.codec_lm.model", "omni.stages.codec_lm.stage",
                "omni.layers.codec.wave_decoder"} <= used, family


def test_the_two_circles_stay_broken():
    """#27: the request stream knows nothing of the kernel (not even for type hints), and Qwen3-TTS's
    runtime modules import nothing of its checkpoint writers, lazily or not."""
    top, lazy = import_graph()
    assert "omni.kernel.kernel" not in (PACKAGE / "kernel" / "requests.py").read_text()
    writers = "omni.models.qwen3_tts.checkpoint"
    offenders = sorted(f"{m} -> {t}" for m in top for t in top[m] | lazy[m]
                       if m.startswith("omni.models.qwen3_tts.") and not m.startswith(writers) and t.startswith(writers))
    assert not offenders, "a runtime module imports a checkpoint writer:\n" + "\n".join(offenders)
