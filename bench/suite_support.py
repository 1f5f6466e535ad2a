"""Process and HTTP helpers of bench/gpu_suite.py: child processes in their own group (killed as
a group: omnid's stage processes share it), readiness probes, and the scaled CPU dry run's
transformers checkpoint."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def kill_group(proc: subprocess.Popen, grace: float, first: int = signal.SIGTERM) -> str:
    """Signal the child's process group, wait `grace` s, then SIGKILL whatever is left of it."""
    try:
        os.killpg(proc.pid, first)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace)
        status = f"stopped (rc {proc.returncode})"
    except subprocess.TimeoutExpired:
        status = f"killed after {grace:.0f}s"
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stage processes share the group
    except ProcessLookupError:
        pass
    proc.wait()
    deadline = time.monotonic() + 10  # let the group's last members go (their GPU memory with them)
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    return status


def child_env(extra: dict | None = None) -> dict:
    """This environment with the repo first on PYTHONPATH (what is already there is kept)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            return resp.status == 200
    except Exception:
        return False


def last_line(path: Path) -> str:
    try:
        lines = [l for l in path.read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def gpu_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_scaled_hf_checkpoint(out: Path) -> Path:
    """transformers' checkpoint of the scaled config (random weights) for the CPU dry run's baseline."""
    import torch
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    from omni.models.qwen3_omni.checkpoint.make_tiny import init_talker_experts
    from omni.models.qwen3_omni.checkpoint.presets_full import scaled_config
    from omni.layers.tokenizer_offline_full import build_tokenizer

    torch.manual_seed(0)
    model = Qwen3OmniMoeForConditionalGeneration(Qwen3OmniMoeConfig(**scaled_config())).eval()
    init_talker_experts(model, 0, 0.02)
    model.save_pretrained(str(out))
    build_tokenizer().save_pretrained(str(out))
    return out


def run_phase(phases: list[dict], out: Path, name: str, cmd: list[str], limit: float, t0: float | None = None,
              env: dict | None = None) -> dict:
    """Run `cmd` as a child in its own process group with output to out/<name>.log, killed with its
    group past `limit` seconds; append and return its phase record (status ok / failed / timed out /
    skipped). Used by the orchestrators whose phases must each end in time."""
    import shlex
    import sys as _sys

    phase = {"name": name, "command": shlex.join(cmd), "limit_s": round(limit, 1)}
    phases.append(phase)
    stamp = f"[{time.monotonic() - t0:6.1f}s] " if t0 is not None else ""
    if limit < 5:
        phase["status"] = "skipped (no time left)"
        print(f"{stamp}{name}: skipped (no time left)", file=_sys.stderr, flush=True)
        return phase
    print(f"{stamp}{name}: {phase['command']} (limit {limit:.0f}s)", file=_sys.stderr, flush=True)
    t = time.monotonic()
    with open(Path(out) / f"{name}.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
                                env=child_env(env))
        try:
            rc = proc.wait(timeout=limit)
            phase["status"] = "ok" if rc == 0 else f"failed (rc {rc}): {last_line(Path(out) / f'{name}.log')[:300]}"
        except subprocess.TimeoutExpired:
            kill_group(proc, grace=10)
            phase["status"] = f"timed out after {limit:.0f}s"
        except BaseException:
            kill_group(proc, grace=2)
            phase["status"] = "interrupted"
            raise
        finally:  # also when it ended: its group's stragglers (an engine's worker processes) hold the GPU
            kill_group(proc, grace=2)
    phase["seconds"] = round(time.monotonic() - t, 1)
    stamp = f"[{time.monotonic() - t0:6.1f}s] " if t0 is not None else ""
    print(f"{stamp}{name}: {phase['status']} in {phase['seconds']}s", file=_sys.stderr, flush=True)
    return phase
