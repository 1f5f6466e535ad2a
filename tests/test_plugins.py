"""Plugins: the example package installs with pip, is discovered (`omnid plugins`) and serves through
`omnid serve` by family name and by checkpoint architecture; a broken plugin is reported with its
name and error and the server starts without it. Also `OmnidProcess`, used by the Piper tests."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import openai
import pytest

from omni.api import cli
from omni.api.cli import CliError, select_model
from omni.models.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "plugins" / "omni-example"


def pip_install(*packages: str | Path, options: tuple[str, ...] = ()) -> None:
    """A real `pip install` of local packages (copied first: building leaves no build/ in the repo)."""
    with tempfile.TemporaryDirectory() as tmp:
        copies = []
        for package in map(Path, packages):
            if package.is_dir():
                copy = Path(tmp) / package.name
                shutil.copytree(package, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
                package = copy
            copies.append(str(package))
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *options, *copies]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr


def pip_install_target(target: Path, *packages: str | Path) -> None:
    """Install local packages into `target` only (put it on PYTHONPATH to use them)."""
    pip_install(*packages, options=("--no-deps", "--target", str(target)))


class OmnidProcess:
    """`omnid serve ...` as a subprocess: waits for the listening line, keeps what it printed."""

    def __init__(self, *args: str, pythonpath: Path | None = None, timeout: float = 120.0) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if pythonpath is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), *filter(None, [env.get("PYTHONPATH")])])
        self.args, self.env, self.timeout = args, env, timeout
        self.lines: list[str] = []
        self.url = ""

    def __enter__(self) -> OmnidProcess:
        self.proc = subprocess.Popen([sys.executable, "-m", "omni.api.cli", "serve", "--port", "0", *self.args],
                                     cwd=ROOT, env=self.env, text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait(10)
                raise AssertionError(f"omnid exited early: {self.lines} / {self.proc.stderr.read()}")
            self.lines.append(line.strip())
            match = re.fullmatch(r"omnid listening on (http://\S+)", line.strip())
            if match:
                self.url = match.group(1)
                return self
        self.__exit__()
        raise AssertionError(f"omnid did not say where it listens: {self.lines}")

    def client(self, timeout: float = 60.0) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="x", max_retries=0, timeout=timeout)

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def omnid_plugins(pythonpath: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    done = subprocess.run([sys.executable, "-m", "omni.api.cli", "plugins"], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def write_broken_plugin(root: Path) -> Path:
    """A package with two broken entry points: one whose register raises, one that cannot import."""
    pkg = root / "omni-broken-example"
    (pkg / "omni_broken_example").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools>=77"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "omni-broken-example"
        version = "0.0.1"

        [project.entry-points."omni.plugins"]
        broken-raises = "omni_broken_example:register"
        broken-import = "omni_broken_example.missing_module:register"
        """))
    (pkg / "omni_broken_example" / "__init__.py").write_text(textwrap.dedent("""\
        def register(registry):
            registry.register_stage("broken.half", "omni_broken_example:Nothing")
            raise RuntimeError("this plugin is deliberately broken")
        """))
    return pkg


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The example plugin and the broken one, pip-installed into one target directory."""
    root = tmp_path_factory.mktemp("plugins")
    target = root / "site"
    pip_install_target(target, EXAMPLE, write_broken_plugin(root))
    assert (target / "omni_example" / "reverse.py").is_file()
    return target


def test_omnid_plugins_lists_each_and_what_it_provides(site):
    out = omnid_plugins(site)
    lines = {line.split(":", 1)[0]: line for line in out.splitlines()}
    assert lines["example"] == ("example: ok; provides stage:example.reverse, "
                                "family:example-reverse (chat)"), out
    assert lines["broken-raises"].startswith("broken-raises: FAILED: RuntimeError: this plugin is deliberately broken")
    assert "broken-import: FAILED: ModuleNotFoundError" in lines["broken-import"]
    assert "omni_broken_example.missing_module" in lines["broken-import"]


def test_registry_loads_plugins_and_resolves_their_stage_kinds(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    registry = Registry()  # as a fresh stage process has it: omni's own kinds only
    cls = registry.stage_class("example.reverse")  # an unknown kind loads the plugins first
    assert cls.__module__ == "omni_example.reverse" and cls.__name__ == "ReverseStage"
    assert registry.families["example-reverse"].provider == "example"
    assert registry.family_for(architectures=["OmniExampleReverser"]).name == "example-reverse"
    reports = {r.name: r for r in registry.load_plugins()}  # loading again reports the same
    assert reports["example"].ok and reports["example"].provides == ["stage:example.reverse",
                                                                     "family:example-reverse (chat)"]
    assert not reports["broken-raises"].ok and "deliberately broken" in reports["broken-raises"].error
    assert "broken.half" not in registry.stage_kinds  # registered before it raised: rolled back
    with pytest.raises(ValueError, match="unknown stage kind 'no.such.kind'"):
        registry.stage_class("no.such.kind")


def test_serves_by_family_name_with_a_broken_plugin_beside_it(site):
    with OmnidProcess("--model", "example-reverse", pythonpath=site) as server:
        said = "\n".join(server.lines)
        assert "plugin 'broken-raises' failed to load (RuntimeError: this plugin is deliberately broken)" in said
        assert "plugin 'broken-import' failed to load (ModuleNotFoundError" in said
        assert "model 'omni-example-reverse' (family example-reverse), 1 stage(s): reverse" in said
        client = server.client()
        models = {m.id: m.root for m in client.models.list().data}
        assert list(models)[0] == "omni-example-reverse" and models["gpt-4o"] == "omni-example-reverse"
        resp = client.chat.completions.create(model="omni-example-reverse",
                                              messages=[{"role": "user", "content": "hello plugin world"}])
        assert resp.choices[0].message.content == "dlrow nigulp olleh"
        assert resp.usage.completion_tokens == 3
        chunks = client.chat.completions.create(model="omni-example-reverse", stream=True,
                                                messages=[{"role": "user", "content": "one two three"}])
        deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert deltas == ["eerht", " owt", " eno"]  # streamed a word per step, through a stage process
        with pytest.raises(openai.BadRequestError):
            client.audio.speech.create(model="omni-example-reverse", voice="x", input="it does not speak")


def test_serves_by_checkpoint_architecture(site, tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["OmniExampleReverser"], "upper": true}')
    with OmnidProcess("--model", str(tmp_path), pythonpath=site) as server:
        resp = server.client().chat.completions.create(model="omni-example-reverse",
                                                       messages=[{"role": "user", "content": "abc def"}])
        assert resp.choices[0].message.content == "FED CBA"


def _args(tmp_path: Path, model=None, family=None, config_text: str | None = None) -> argparse.Namespace:
    config = None
    if config_text is not None:
        config = tmp_path / "omni.toml"
        config.write_text(config_text)
    return argparse.Namespace(model=model, family=family, variant=None, config=config and str(config))


def test_select_model_by_name_flag_or_config(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "embedded_default_model", lambda: ("/cache/embedded", None))
    families = {"example-reverse": object(), "demo": object()}
    assert select_model(_args(tmp_path, model="example-reverse"), families) == (None, "example-reverse", None)
    assert select_model(_args(tmp_path, model=str(tmp_path)), families) == (str(tmp_path), None, None)
    table = '[model]\nfamily = "example-reverse"\nvariant = "text"\n'
    assert select_model(_args(tmp_path, config_text=table), families) == (None, "example-reverse", "text")
    assert select_model(_args(tmp_path, family="demo", config_text=table), families) == (None, "demo", "text")
    assert select_model(_args(tmp_path), families) == ("/cache/embedded", None, None)
    with pytest.raises(CliError, match="takes only family, path and variant"):
        select_model(_args(tmp_path, config_text='[model]\nfamliy = "x"\n'), families)
