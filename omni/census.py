"""A heap and tensor census of one stage process (or of omnid), on SIGUSR1, to tell a leak from
allocator high-water (issue 25: the thinker grew under mixed traffic).

Enabled by $OMNI_CENSUS_DIR (omni/env.py): each stage process (and omnid, as `omnid`) then writes
`<dir>/<stage>-<pid>-<n>.json` at every SIGUSR1: its RSS; live Python objects by type; torch
tensors alive (count, bytes, the commonest shapes); glibc's heap (`mallinfo2`: bytes in use vs
bytes taken from the OS) and the RSS after `malloc_trim(0)`; tracemalloc's top lines when
tracemalloc runs (PYTHONTRACEMALLOC=N). A leak grows the objects, tensors or heap in use; a
high-water mark grows only the RSS, and the trim gives it back. torch is read only if the stage
imported it: this module imports nothing heavy.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

TOP = 30


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def rss_bytes(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _heap() -> dict[str, Any] | None:
    """glibc's view: bytes handed out (in use) vs held from the OS (arena + mmapped)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return None
    return {"in_use_bytes": info.uordblks + info.hblkhd, "from_os_bytes": info.arena + info.hblkhd,
            "free_in_heap_bytes": info.fordblks}


def _trim() -> int | None:
    """RSS after giving the heap's free pages back to the OS."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return None
    return rss_bytes()


def _tensors(objects: list) -> dict[str, Any] | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    seen, total, shapes = set(), 0, Counter()
    count = 0
    for obj in objects:
        try:
            if not isinstance(obj, torch.Tensor):
                continue
            count += 1
            shapes[f"{obj.dtype}{list(obj.shape)}@{obj.device}"] += 1
            storage = obj.untyped_storage()
            key = (storage.data_ptr(), obj.device.type)
            if key not in seen:
                seen.add(key)
                total += storage.nbytes()
        except Exception:  # a tensor subclass or a meta tensor without storage: counted, not sized
            continue
    return {"count": count, "storage_bytes": total, "top_shapes": shapes.most_common(TOP),
            "holders": _holders(objects, torch, [shape for shape, _ in shapes.most_common(3)])}


def _shape_of(obj, torch) -> str | None:
    """A tensor's "dtype[shape]@device"; None for anything else (a dead weak proxy included)."""
    try:
        return f"{obj.dtype}{list(obj.shape)}@{obj.device}" if isinstance(obj, torch.Tensor) else None
    except ReferenceError:
        return None


def _holders(objects: list, torch, shapes: list[str]) -> dict[str, list[str]]:
    """Who holds a few tensors of the commonest shapes: each referrer, and what holds that one by
    name (an object's attribute, a dict's key), so that a cache that only grows names itself."""
    out: dict[str, list[str]] = {}
    skip = {id(objects)}
    for shape in shapes:
        found = [o for o in objects if _shape_of(o, torch) == shape]
        skip.add(id(found))
        chains, sample = Counter(), found[:5]
        skip.add(id(sample))
        for tensor in sample:
            for ref in gc.get_referrers(tensor):
                if id(ref) not in skip:
                    chains[f"{_name(ref)} <- {'; '.join(_named_holders(ref, skip))}"] += 1
        out[shape] = [f"{n}x {chain}" for chain, n in chains.most_common(5)]
    return out


def _name(obj) -> str:
    size = f"(len {len(obj)})" if isinstance(obj, (list, dict, tuple, set)) else ""
    return type(obj).__qualname__ + size


def _named_holders(obj, skip: set) -> list[str]:
    names = []
    for up in gc.get_referrers(obj):
        if id(up) in skip or type(up).__name__ in ("frame", "list_iterator", "cell"):
            continue
        if isinstance(up, dict):
            keys = [str(k) for k, v in up.items() if v is obj][:2]
            owners = [type(o).__qualname__ for o in gc.get_referrers(up) if hasattr(o, "__dict__") and id(o) not in skip]
            names.append(f"{'/'.join(owners[:1]) or 'dict'}.{','.join(keys)}")
        elif hasattr(up, "__dict__") and not isinstance(up, type):
            keys = [k for k, v in vars(up).items() if v is obj][:2]
            names.append(f"{type(up).__qualname__}.{','.join(keys)}" if keys else _name(up))
        else:
            names.append(_name(up))
    return sorted(names, key=lambda n: "." not in n)[:4]  # named holders first


def snapshot() -> dict[str, Any]:
    """The census of this process now."""
    import warnings

    warnings.simplefilter("ignore", FutureWarning)  # isinstance() over every object touches deprecated attributes
    gc.collect()
    objects = gc.get_objects()
    census: dict[str, Any] = {"time": time.time(), "pid": os.getpid(), "rss_bytes": rss_bytes(),
                              "gc_objects": len(objects),
                              "top_types": Counter(type(o).__qualname__ for o in objects).most_common(TOP),
                              "tensors": _tensors(objects), "heap": _heap()}
    del objects
    if tracemalloc.is_tracing():
        stats = tracemalloc.take_snapshot().statistics("lineno")[:TOP]
        census["tracemalloc_top"] = [[str(s.traceback), s.size, s.count] for s in stats]
    census["rss_after_trim_bytes"] = _trim()
    return census


def install_if_asked(loop, name: str) -> None:
    """Write a census to $OMNI_CENSUS_DIR at every SIGUSR1 (on the event loop: the worker thread
    runs on); nothing without the variable."""
    import signal

    from omni.env import census_dir

    directory = census_dir()
    if not directory:
        return
    count = [0]

    def dump() -> None:
        count[0] += 1
        path = Path(directory) / f"{name}-{os.getpid()}-{count[0]}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")  # whole or absent for a reader (bench/soak.py)
        partial.write_text(json.dumps(snapshot()))
        os.replace(partial, path)

    loop.add_signal_handler(signal.SIGUSR1, dump)
