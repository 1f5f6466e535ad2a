"""The report writer the bench scripts share: where a run happened (`machine`), when (`now_iso`), the
command that made it (`command`), markdown tables (`md_table`) and the JSON + markdown pair every
benchmark writes (`write`), so that each report carries its command and machine the same way.

Each benchmark keeps its own `markdown(report)` (what goes in the table is the benchmark's); this
module holds only what was written the same way in several of them.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    """Where the process ran (a client's report says where its server was via its own `server` key)."""
    info: dict[str, Any] = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                            "cpu_count": os.cpu_count(), "python": platform.python_version()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        info["numpy"] = numpy.__version__
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu_model"] = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
    return info


def machine_line(m: dict[str, Any]) -> str:
    """`cpu model, N CPUs[, gpu]`: the machine as a report's markdown names it."""
    cpu = m.get("cpu_model") or m.get("processor") or platform.machine()
    return f"{cpu}, {m['cpu_count']} CPUs" + (f", {m['gpu']}" if "gpu" in m else "")


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def command(script: str, argv: Sequence[str] | None = None, python: str = "python") -> str:
    """The command line that reproduces this run, e.g. `python bench/transport.py --quick`."""
    return " ".join([python, script, *(sys.argv[1:] if argv is None else argv)])


def cell(value: Any) -> str:
    return "–" if value is None else str(value)


def md_table(columns: Sequence[str], rows: Iterable[dict[str, Any]], fmt: Callable[[Any], str] = cell) -> list[str]:
    """A markdown table's lines: a column per name, a line per row (row[name]; a missing value is –)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(row.get(c)) for c in columns) + " |" for row in rows]
    return lines


def write(report: dict[str, Any], out: str | Path | None, md: str | Path | None,
          markdown: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
    """Write the run's JSON (`out`) and markdown (`md`, from `markdown(report)`), either may be None."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2) + "\n")
    if md:
        Path(md).parent.mkdir(parents=True, exist_ok=True)
        Path(md).write_text(markdown(report))
    return report
