"""omnid's CUDA MPS daemon: started only for stages sharing a GPU, exported to stage processes,
quit and cleaned up on stop. A fake `nvidia-cuda-mps-control` on PATH records what it is told."""

from __future__ import annotations

import os
import stat

import pytest

from omni.api.mps import CONTROL, MPSError, shared_devices, start_mps

FAKE = """#!/bin/sh
echo "$@ pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "{log}"
if [ "$1" != "-d" ]; then cat >> "{log}"; fi
"""


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / CONTROL
    exe.write_text(FAKE.format(log=log))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    return log


def test_shared_devices():
    assert shared_devices(["cuda", "cuda:0", "cuda:1", "cpu", "cpu"]) == ["cuda:0"]
    assert shared_devices(["cuda:0", "cuda:1", "cpu"]) == []


def test_auto_starts_for_shared_gpu_and_stops_clean(fake_control):
    assert start_mps("auto", ["cuda:0", "cuda:1", "cpu"]) is None  # nothing shares a GPU
    assert start_mps("off", ["cuda:0", "cuda:0"]) is None
    daemon = start_mps("auto", ["cuda:0", "cuda:0", "cpu"])
    assert daemon is not None
    pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]  # what spawned stage processes inherit
    assert pipe.startswith(daemon.root) and os.path.isdir(pipe)
    daemon.stop()
    calls = fake_control.read_text().splitlines()
    assert calls[0] == f"-d pipe={pipe}" and calls[-1] == "quit"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ and not os.path.exists(daemon.root)


def test_on_without_the_binary_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MPSError, match="not on PATH"):
        start_mps("on", ["cuda:0", "cuda:0"])
    assert start_mps("auto", ["cuda:0", "cuda:0"]) is None  # auto goes on without it
