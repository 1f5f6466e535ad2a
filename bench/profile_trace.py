"""Reads a torch.profiler chrome trace of AR decode steps: per-step GPU busy vs wall time, top
kernels, time per category. Pure Python over the trace JSON (no torch), so it runs on traces
from any machine; used by bench/profile_decode.py.

Steps are CPU `user_annotation` ranges named `<prefix><i>`. Device events are CUDA kernels,
memcpys and memsets; on a CPU-only trace (dry runs) the leaf CPU ops stand in for them. A
device event belongs to the step whose window [start_i, start_{i+1}) holds its start (each
engine step ends in a host sync, so its GPU work ends inside it).

Categories come from an eager "attribution" trace in which the model's modules were wrapped
in `cat:<category>` record_function scopes: a kernel's category is the innermost scope around
its launch (found through the runtime call with the same correlation id). Kernel names of the
graph-mode trace take the eager trace's per-name category shares; names it never saw fall back
to name patterns.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
SCOPE_PREFIX = "cat:"
GEMM_NAME = re.compile(r"gemm|gemv|nvjet|cutlass|xmma|cublas|matmul|::mm$|::bmm|::addmm|::_grouped_mm|_mm_|grouped"
                       r"|wgmma|sm\d\d_|gate_up|down_weighted|fused_moe", re.I)  # (the last three: Triton MoE)
FALLBACK = [  # (pattern, category) for kernels the attribution run never saw
    (re.compile(r"moe|expert", re.I), "MoE GEMMs"),
    (re.compile(r"memcpy|memset|copy", re.I), "copies"),
    (re.compile(r"attn|attention|flash|fmha|paged|decode", re.I), "attention"),
    (re.compile(r"sort|topk|index|scatter|gather|cumsum|radix|histogram|arange", re.I), "MoE sort/index/act"),
    (GEMM_NAME, "dense GEMMs (q/k/v/o proj)"),
    (re.compile(r"norm|rsqrt|reduce", re.I), "norms"),
    (re.compile(r"argmax|softmax", re.I), "sampling/engine"),
]
# The categories the report groups into (what the issue asks about).
GROUPS = {
    "attention": ("attention",),
    "MoE GEMMs": ("MoE GEMMs",),
    "routing/sort/index": ("MoE routing", "MoE sort/index/act"),
    "dense GEMMs (q/k/v/o)": ("dense GEMMs (q/k/v/o proj)",),
    "norms/rope/elementwise": ("norms", "rope", "residual/elementwise"),
    "lm_head/sampling": ("lm_head", "sampling/engine"),
    "copies/other": ("copies", "other"),
}


def load(path: str | Path) -> list[dict[str, Any]]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def step_windows(events: list[dict], prefix: str) -> list[tuple[float, float]]:
    """(start, end) in us of each `<prefix><i>` CPU annotation, in step order."""
    steps = [e for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(prefix)]
    steps.sort(key=lambda e: e["ts"])
    return [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in steps]


def _leaf_cpu_ops(events: list[dict]) -> list[dict]:
    """CPU ops that contain no other CPU op on their thread (what ran, not what called it)."""
    by_tid: dict[Any, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op" and e.get("ph") == "X":
            by_tid[e.get("tid")].append(e)
    leaves = []
    for ops in by_tid.values():
        ops.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        for i, op in enumerate(ops):
            end = op["ts"] + op.get("dur", 0)
            nxt = ops[i + 1] if i + 1 < len(ops) else None
            if nxt is None or nxt["ts"] >= end:
                leaves.append(op)
    return leaves


def device_events(events: list[dict]) -> list[dict]:
    dev = [e for e in events if e.get("cat") in DEVICE_CATS and e.get("ph") == "X"]
    return dev if dev else _leaf_cpu_ops(events)


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + ((cur_e - cur_s) if cur_e is not None else 0.0)


def _launch_ts(events: list[dict], dev: list[dict]) -> list[float]:
    """Host time at which each device event was launched (its own ts for CPU ops); Triton kernels
    are launched through the driver API (`cuda_driver`), the rest through the runtime."""
    runtime = {e["args"]["correlation"]: float(e["ts"]) for e in events
               if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in (e.get("args") or {})}
    return [runtime.get((d.get("args") or {}).get("correlation"), float(d["ts"])) for d in dev]


def attribution(events: list[dict]) -> dict[str, dict[str, float]]:
    """{kernel name: {category: us}} from an eager trace with `cat:<category>` scopes."""
    scopes = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["name"][len(SCOPE_PREFIX):])
                    for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(SCOPE_PREFIX))
    starts = [s[0] for s in scopes]
    dev = device_events(events)
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for d, t in zip(dev, _launch_ts(events, dev)):
        category = "sampling/engine"  # launched outside every module scope
        for _, end, cat in reversed(scopes[: bisect.bisect_right(starts, t)]):
            if end >= t:  # scopes nest: the latest-starting one that holds t is the innermost
                category = cat
                break
        if category == "MoE experts":
            category = "MoE GEMMs" if GEMM_NAME.search(d["name"]) else "MoE sort/index/act"
        out[d["name"]][category] += float(d.get("dur", 0))
    return {k: dict(v) for k, v in out.items()}


def categorize(name: str, shares: dict[str, dict[str, float]]) -> dict[str, float]:
    """{category: fraction} for a kernel name."""
    seen = shares.get(name)
    if seen and sum(seen.values()) > 0:
        total = sum(seen.values())
        return {c: us / total for c, us in seen.items()}
    for pattern, category in FALLBACK:
        if pattern.search(name):
            return {category: 1.0}
    return {"other": 1.0}


def summarize(events: list[dict], prefix: str, shares: dict[str, dict[str, float]], top: int = 25) -> dict[str, Any]:
    """Per-step wall and device-busy time, top kernels and categories over the profiled steps."""
    windows = step_windows(events, prefix)
    if not windows:
        raise ValueError(f"no '{prefix}<i>' annotations in the trace")
    dev = device_events(events)
    starts = [w[0] for w in windows]
    per_step: list[list[dict]] = [[] for _ in windows]
    for d in dev:
        i = bisect.bisect_right(starts, float(d["ts"])) - 1
        if i >= 0 and (i + 1 < len(windows) or float(d["ts"]) <= windows[i][1] + 1000):
            per_step[i].append(d)
    n = len(windows)
    wall = [e - s for s, e in windows]
    busy = [_union_us([(float(d["ts"]), float(d["ts"]) + float(d.get("dur", 0))) for d in ds]) for ds in per_step]
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for ds in per_step:
        for d in ds:
            by_name[d["name"]][0] += float(d.get("dur", 0))
            by_name[d["name"]][1] += 1
    total = sum(v[0] for v in by_name.values()) or 1.0
    cats: dict[str, float] = defaultdict(float)
    for name, (us, _) in by_name.items():
        for c, frac in categorize(name, shares).items():
            cats[c] += us * frac
    kernels = [{"name": name[:160], "us_per_step": round(us / n, 2), "count_per_step": round(cnt / n, 2),
                "share": round(us / total, 4), "category": max(categorize(name, shares).items(), key=lambda kv: kv[1])[0]}
               for name, (us, cnt) in sorted(by_name.items(), key=lambda kv: -kv[1][0])]
    groups = {g: round(sum(cats.get(c, 0.0) for c in members) / n, 2) for g, members in GROUPS.items()}
    return {
        "steps": n,
        "wall_us_per_step": round(sum(wall) / n, 2),
        "device_busy_us_per_step": round(sum(busy) / n, 2),
        "host_only_us_per_step": round((sum(wall) - sum(busy)) / n, 2),
        "device_busy_fraction": round(sum(busy) / sum(wall), 4) if sum(wall) else None,
        "kernels_per_step": round(sum(len(ds) for ds in per_step) / n, 1),
        "kernel_us_per_step": round(total / n, 2) if by_name else 0.0,
        "top_kernels": kernels[:top],
        "categories_us_per_step": {c: round(us / n, 2) for c, us in sorted(cats.items(), key=lambda kv: -kv[1])},
        "groups_us_per_step": groups,
    }


def write_window(events: list[dict], window: tuple[float, float], path: str | Path) -> int:
    """A small gzip chrome trace: metadata plus the events that overlap `window`; returns its bytes."""
    s, e = window
    keep = [ev for ev in events if ev.get("ph") == "M" or
            ("ts" in ev and float(ev["ts"]) <= e and float(ev["ts"]) + float(ev.get("dur", 0)) >= s)]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": keep}, f)
    return Path(path).stat().st_size
