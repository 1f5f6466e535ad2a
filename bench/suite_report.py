"""bench/gpu_suite.py's combined report: omni (bench/serve.py levels) against transformers
(bench/hf_baseline.py) at each concurrency, as one JSON-able dict and one markdown page.

omni's rows carry their phase: cold (a fresh server, no warm-up), warm (after a warm-up through
every level), greedy (the extra line: temperature 0 for text and talker). `cold_vs_warm` puts each
cold level beside the warm level of the same concurrency (the target: a fresh server's first
request within 1.5x of a warm one).

Speed-ups are transformers / omni for times (TTFA, end-to-end, RTF: > 1 means omni is
faster) and omni / transformers for throughput (audio seconds per second). transformers'
levels above 1 are its FIFO queue of measured service times (`simulated_queue`).
"""

from __future__ import annotations

from typing import Any

from serve_report import markdown_table

COLUMNS = [  # (label, level key, sub key)
    ("TTFT p50 ms", "ttft_ms", "p50"), ("TPOT p50 ms", "tpot_ms", "p50"), ("TTFA p50 ms", "ttfa_ms", "p50"),
    ("TTFA p90 ms", "ttfa_ms", "p90"), ("RTF p50", "rtf", "p50"), ("RTF p90", "rtf", "p90"),
    ("E2E p50 ms", "e2e_ms", "p50"), ("req/s", "throughput", "requests_per_s"),
    ("tok/s", "throughput", "output_tokens_per_s"), ("audio s/s", "throughput", "audio_s_per_s"),
]


def _get(level: dict | None, key: str, sub: str) -> float | None:
    return ((level or {}).get(key) or {}).get(sub)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def merge_levels(reports: list[dict]) -> dict | None:
    """Per-level serve.py reports (one concurrency each) -> one report with every level."""
    reports = [r for r in reports if r and r.get("levels")]
    if not reports:
        return None
    merged = dict(reports[0])
    merged["levels"] = [lv for r in reports for lv in r["levels"]]
    merged["commands"] = [r["command"] for r in reports]
    return merged


def comparison(omni: dict | None, hf: dict | None) -> list[dict[str, Any]]:
    """One row per concurrency omni ran: both sides' figures and the speed-ups."""
    hf_levels = {lv["concurrency"]: lv for lv in (hf or {}).get("levels", [])}
    rows = []
    for lv in (omni or {}).get("levels", []):
        c = lv["concurrency"]
        other = hf_levels.get(c)
        row: dict[str, Any] = {"phase": lv.get("phase", "warm"), "concurrency": c,
                               "omni_ok": f"{lv['ok']}/{lv['requests']}"}
        for label, key, sub in COLUMNS:
            row[f"omni {label}"] = _get(lv, key, sub)
            row[f"hf {label}"] = _get(other, key, sub)
        row["speedup TTFA p50"] = _ratio(_get(other, "ttfa_ms", "p50"), _get(lv, "ttfa_ms", "p50"))
        row["speedup E2E p50"] = _ratio(_get(other, "e2e_ms", "p50"), _get(lv, "e2e_ms", "p50"))
        row["speedup RTF p50"] = _ratio(_get(other, "rtf", "p50"), _get(lv, "rtf", "p50"))
        row["speedup audio throughput"] = _ratio(_get(lv, "throughput", "audio_s_per_s"),
                                                 _get(other, "throughput", "audio_s_per_s"))
        rows.append(row)
    return rows


def cold_vs_warm(omni: dict | None) -> list[dict[str, Any]]:
    """Each cold level against the warm level of the same concurrency: ratios cold / warm (> 1: the
    fresh server is slower), and the first request's TTFA / RTF against the warm p50."""
    levels = (omni or {}).get("levels", [])
    warm = {lv["concurrency"]: lv for lv in levels if lv.get("phase") == "warm"}
    rows = []
    for lv in levels:
        if lv.get("phase") != "cold":
            continue
        c, w = lv["concurrency"], warm.get(lv["concurrency"])
        first = lv.get("first_request") or {}
        rows.append({
            "concurrency": c,
            "cold TTFA p50 ms": _get(lv, "ttfa_ms", "p50"), "warm TTFA p50 ms": _get(w, "ttfa_ms", "p50"),
            "cold RTF p50": _get(lv, "rtf", "p50"), "warm RTF p50": _get(w, "rtf", "p50"),
            "first TTFA ms": first.get("ttfa_ms"), "first RTF": first.get("rtf"),
            "TTFA p50 cold/warm": _ratio(_get(lv, "ttfa_ms", "p50"), _get(w, "ttfa_ms", "p50")),
            "RTF p50 cold/warm": _ratio(_get(lv, "rtf", "p50"), _get(w, "rtf", "p50")),
            "first TTFA / warm p50": _ratio(first.get("ttfa_ms"), _get(w, "ttfa_ms", "p50")),
            "first E2E / warm p50": _ratio(first.get("e2e_ms"), _get(w, "e2e_ms", "p50")),
        })
    return rows


def _fmt(v: Any) -> str:
    return "–" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def markdown(report: dict[str, Any]) -> str:
    wl = report["workload"]
    extra = report.get("omnid_args") or []
    versus = " vs transformers" if report.get("hf") else " serving"
    out = [f"## {report.get('label', 'omni')}{versus}, Qwen3-Omni ({report['model']}), {report['date']}", "",
           f"Machine: {report.get('gpu') or report['machine'].get('cpu_model', '?')}; suite {report['seconds']} s; "
           f"workload: prompt set `{wl['prompt_set']}`, {wl['max_tokens']} thinker tokens, {wl['audio_tokens']} talker "
           f"frames, speech out, ignore_eos; sampling: {wl.get('sampling', '?')}. Cold levels {wl.get('cold')} "
           f"(fresh server, no warm-up), warm levels {wl.get('concurrency')}, greedy levels {wl.get('greedy')}."
           + (f" Extra omnid arguments: `{' '.join(extra)}`." if extra else ""), "",
           "| phase | seconds | result |", "|---|---|---|"]
    for p in report["phases"]:
        out.append(f"| {p['name']} | {p.get('seconds', '–')} | {p.get('status', '?')} |")
    rows = report["comparison"]
    if rows:
        speed = ["speedup TTFA p50", "speedup E2E p50", "speedup RTF p50", "speedup audio throughput"]
        out += ["", "| phase | c | omni ok | " + " | ".join(f"omni {c[0]}" for c in COLUMNS) + " | "
                + " | ".join(speed) + " |", "|" + "---|" * (3 + len(COLUMNS) + len(speed))]
        for r in rows:
            out.append(f"| {r.get('phase', 'warm')} | {r['concurrency']} | {r['omni_ok']} | "
                       + " | ".join(_fmt(r[f"omni {c[0]}"]) for c in COLUMNS)
                       + " | " + " | ".join(_fmt(r[s]) for s in speed) + " |")
    cw = report.get("cold_vs_warm") or []
    if cw:
        keys = list(cw[0])
        out += ["", "Fresh server (cold) against warm:", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        out += ["| " + " | ".join(_fmt(r[k]) for k in keys) + " |" for r in cw]
    for side in ("omni", "hf"):
        if report.get(side):
            out += ["", f"### {report[side]['label']}", "", markdown_table(report[side])]
    out += ["", "Speed-ups: transformers / omni for TTFA, E2E and RTF (> 1: omni faster); omni / transformers for "
                "audio seconds per second. transformers serves one request at a time: its levels above 1 are a FIFO "
                "queue of its measured service times.", "", "Commands:", ""]
    out += [f"- `{c}`" for c in report["commands"]]
    return "\n".join(out) + "\n"
