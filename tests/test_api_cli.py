"""`omnid serve` as a real subprocess: progress, the listening line, requests through the openai
client, SIGTERM drains the in-flight request and leaves no stage process behind. Plus the other
subcommands and the SGLang serve-backend entry."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest
import requests

ROOT = Path(__file__).resolve().parents[1]


def omnid(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "omni.api.cli", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def read_until_listening(proc: subprocess.Popen, timeout: float = 90.0) -> tuple[str, list[str]]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"omnid exited early: {lines} / {proc.stderr.read()}")
        lines.append(line.strip())
        match = re.fullmatch(r"omnid listening on (http://\S+)", line.strip())
        if match:
            return match.group(1), lines
    raise AssertionError(f"omnid did not say where it listens: {lines}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_serve_subprocess_end_to_end_and_sigterm_drains():
    proc = omnid("serve", "--model", "demo", "--port", "0", "--set", "generator.args.step_delay_s=0.01",
                 "--max-concurrent", "4")
    try:
        url, progress = read_until_listening(proc)
        assert any("stages up" in line for line in progress), progress
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)
        resp = client.chat.completions.create(model="omni-demo", messages=[{"role": "user", "content": "hi"}],
                                              extra_body={"stage_sampling": {"generator": {"max_tokens": 4}}})
        assert len(resp.choices[0].message.content) == 4
        speech = client.audio.speech.create(model="omni-demo", voice="tone", input="hi", response_format="wav")
        assert speech.content[:4] == b"RIFF"
        metrics = requests.get(url + "/metrics", timeout=10).text
        pids = [int(float(v)) for v in re.findall(r'omni_stage_pid\{stage="\w+\.0"\} (\S+)', metrics)]
        assert len(pids) == 3 and all(alive(p) for p in pids)

        result: dict = {}

        def slow_request():  # 150 tokens at 10 ms: in flight when SIGTERM arrives
            result["resp"] = requests.post(url + "/v1/chat/completions", timeout=30, json={
                "model": "omni-demo", "messages": [{"role": "user", "content": "long"}],
                "stage_sampling": {"generator": {"max_tokens": 150}}})

        worker = threading.Thread(target=slow_request)
        worker.start()
        time.sleep(0.4)
        proc.send_signal(signal.SIGTERM)
        worker.join(30)
        assert result["resp"].status_code == 200, result["resp"].text  # drained, not cut off
        assert len(result["resp"].json()["choices"][0]["message"]["content"]) == 150
        assert proc.wait(30) == 0
        err = proc.stderr.read()
        assert "omnid stopped" in err and "RANDOM weights" in err
        time.sleep(0.2)
        assert not [p for p in pids if alive(p)]  # no stage left behind
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_bad_override_is_one_clear_line():
    proc = omnid("serve", "--model", "demo", "--port", "0", "--set", "nosuchstage.replicas=2")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "omnid: error:" in err and "nosuchstage" in err and "Traceback" not in err


def test_plugins_subcommand_lists_or_says_none():
    proc = omnid("plugins")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip()


def test_make_tiny_subcommand(tmp_path):
    pytest.importorskip("omni.models.qwen3_omni.checkpoint.make_tiny")
    proc = omnid("make-tiny", str(tmp_path / "tiny"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    config = json.loads((tmp_path / "tiny" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3OmniMoeForConditionalGeneration"]


def _sglang_serve_backends():
    """sglang.cli.serve_backends; when sglang is installed without its dependencies its package
    __init__ does not import (orjson, triton...), so the stdlib-only module is loaded on its own."""
    import importlib.util

    try:
        import sglang.cli.serve_backends as module

        return module
    except ImportError:
        pass
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "cli" / "serve_backends.py"
    if not path.is_file():
        pytest.skip("this sglang has no serve_backends module")
    mod_spec = importlib.util.spec_from_file_location("sglang.cli.serve_backends", path)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules["sglang.cli.serve_backends"] = module
    mod_spec.loader.exec_module(module)
    return module


def test_sglang_entry_point_declared():
    text = (ROOT / "pyproject.toml").read_text()
    if "sglang.serve_backends" not in text:
        pytest.skip("pyproject.toml does not declare the sglang.serve_backends entry point yet")
    import tomllib

    from omni.kernel.registry import resolve

    group = tomllib.loads(text)["project"]["entry-points"]["sglang.serve_backends"]
    assert group == {"omni": "omni.api.sglang_backend:backend"}
    assert callable(resolve(group["omni"]))


def test_sglang_serve_backend(tmp_path, capsys):
    serve_backends = _sglang_serve_backends()
    from omni.api import sglang_backend

    backend = sglang_backend.backend()
    assert isinstance(backend, serve_backends.ServeBackend)
    assert backend.api_version == serve_backends.SERVE_BACKEND_API_VERSION
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3OmniMoeForConditionalGeneration"]}))
    request = serve_backends.ServeRequest(argv=("--model-path", str(tmp_path)), model_path=str(tmp_path))
    assert backend.detect(request) is serve_backends.ServeBackendDetection.MATCH
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert backend.detect(request) is serve_backends.ServeBackendDetection.NO_MATCH
    empty = serve_backends.ServeRequest(argv=(), model_path=None)
    assert backend.detect(empty) is serve_backends.ServeBackendDetection.UNKNOWN
    backend.run(serve_backends.ServeRequest(argv=("--help",), model_path=None))
    assert "--max-concurrent" in capsys.readouterr().out
