"""`python -m bench` (bench/__main__.py): the listing names every user-facing benchmark, each listed
one's `--help` runs through the entry point, and an unknown name says which one was meant."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.__main__ import BENCHMARKS  # noqa: E402


def _bench(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_listing_names_the_user_facing_benchmarks():
    proc = _bench()
    assert proc.returncode == 0, proc.stderr
    for name in ("serve", "tts", "realtime", "whisper", "equal-work", "transport"):
        assert f"  {name} " in proc.stdout
    for name, (script, _desc) in BENCHMARKS.items():
        assert (ROOT / "bench" / script).is_file(), name
        assert f"[bench/{script}]" in proc.stdout


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_each_listed_benchmark_help_runs(name):
    proc = _bench(name, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: " + BENCHMARKS[name][0])


def test_unknown_name_suggests_the_close_one():
    proc = _bench("serv")
    assert proc.returncode == 2
    assert "did you mean 'serve'" in proc.stderr


def test_results_name_only_scripts_that_exist_or_were_folded():
    """Each figure in bench/RESULTS.md names the script that made it: a script of bench/ that is there,
    or a folded one-off H200 script whose row in "Which command reproduces what" says which recipes
    run the same steps now (and those recipes are there)."""
    import re

    text = (ROOT / "bench" / "RESULTS.md").read_text()
    section = text.split("## Which command reproduces what", 1)[1].split("\n## ", 1)[0]
    folded = {}
    for row in re.findall(r"^\| (`.+?`.*?) \| (.+) \|$", section, re.M):
        for name in re.findall(r"`([\w.-]+\.sh)`", row[0]):
            folded[name] = row[1]
    assert folded, "the table of folded scripts is gone"
    for name, now in folded.items():
        for recipe in re.findall(r"\$G/([\w.-]+\.sh)", now):
            assert (ROOT / "bench" / "h200" / recipe).is_file(), f"{name}'s row names {recipe}, which is gone"
    named = set(re.findall(r"bench/((?:h200/)?[\w.-]+\.(?:py|sh))", text))
    named |= {f"h200/{n}" for n in re.findall(r"`([\w.-]+\.sh)`", text)}
    missing = sorted(n for n in named if not (ROOT / "bench" / n).is_file() and Path(n).name not in folded)
    assert not missing, f"RESULTS names scripts that neither exist nor were folded: {missing}"
