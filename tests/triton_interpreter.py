"""Runs a kernel check in triton's interpreter on the CPU: in a child process, since TRITON_INTERPRET=1
must be set before triton is imported. The check's code prints "interpreter ok" when it passed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_in_interpreter(code: str, timeout: int = 240) -> None:
    pytest.importorskip("triton", reason="triton is not installed (the kernels' CPU check needs its interpreter)")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert proc.returncode == 0 and "interpreter ok" in proc.stdout, proc.stderr[-4000:]
