"""Shared by bench/serve.py and bench/hf_baseline.py: per-request rows -> per-level metrics,
the markdown table and the PNG plots, so that both tools report the same figures the same way.

A request row (dict) has: ok, error, latency_s (submit -> last byte), ttft_s (first text),
tpot_s (mean time between output tokens after the first), ttfa_s (first audio), audio_s
(seconds of audio received), output_tokens. Missing figures are None (e.g. no audio asked).
RTF = latency / audio seconds (seconds of work per second of speech; lower is better).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from report import machine, machine_line, now_iso, say, write  # noqa: F401 (re-exported)

PERCENTILES = (50, 90, 99)


def stats(values: list[float | None], scale: float = 1.0, digits: int = 2) -> dict[str, float] | None:
    """{"mean", "p50", "p90", "p99"} of the non-None values times `scale`, or None if there are none."""
    xs = np.asarray([v for v in values if v is not None], dtype=np.float64) * scale
    if xs.size == 0:
        return None
    out = {"mean": round(float(xs.mean()), digits)}
    for p in PERCENTILES:
        out[f"p{p}"] = round(float(np.percentile(xs, p)), digits)
    return out


def level_summary(rows: list[dict[str, Any]], wall_s: float, concurrency: int) -> dict[str, Any]:
    """One concurrency level: counts, latency figures (ms), RTF and throughput over the level's wall time."""
    ok = [r for r in rows if r["ok"]]
    tokens = sum(r["output_tokens"] or 0 for r in ok)
    audio = sum(r["audio_s"] or 0.0 for r in ok)
    rtf = [r["latency_s"] / r["audio_s"] if r.get("audio_s") else None for r in ok]
    errors: dict[str, int] = {}
    for r in rows:
        if not r["ok"]:
            key = (r.get("error") or "?")[:120]
            errors[key] = errors.get(key, 0) + 1
    return {
        "concurrency": concurrency,
        "requests": len(rows),
        "ok": len(ok),
        "failed": len(rows) - len(ok),
        "errors": errors,
        "wall_s": round(wall_s, 3),
        "output_tokens": tokens,
        "audio_s": round(audio, 3),
        "ttft_ms": stats([r.get("ttft_s") for r in ok], 1000),
        "tpot_ms": stats([r.get("tpot_s") for r in ok], 1000),
        "ttfa_ms": stats([r.get("ttfa_s") for r in ok], 1000),
        "e2e_ms": stats([r["latency_s"] for r in ok], 1000),
        "rtf": stats(rtf, 1.0, 4),
        "throughput": {
            "requests_per_s": round(len(ok) / wall_s, 3) if wall_s > 0 else None,
            "output_tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
            "audio_s_per_s": round(audio / wall_s, 3) if wall_s > 0 else None,
        },
    }


def _cell(d: dict | None, key: str) -> str:
    return "–" if not d or d.get(key) is None else f"{d[key]:g}"


def markdown_table(report: dict[str, Any]) -> str:
    """The levels of one report as a markdown table (ms unless said)."""
    head = ("| phase | concurrency | ok/failed | TTFT p50/p99 | TPOT p50 | TTFA p50/p90/p99 | RTF p50/p90 | "
            "E2E p50/p90/p99 | first request TTFA / RTF | tok/s | req/s | audio s/s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for lv in report["levels"]:
        t = lv["throughput"]
        first = lv.get("first_request")
        lines.append(
            f"| {lv.get('phase', '–')} | {lv['concurrency']} | {lv['ok']}/{lv['failed']} "
            f"| {_cell(lv['ttft_ms'], 'p50')} / {_cell(lv['ttft_ms'], 'p99')} "
            f"| {_cell(lv['tpot_ms'], 'p50')} "
            f"| {_cell(lv['ttfa_ms'], 'p50')} / {_cell(lv['ttfa_ms'], 'p90')} / {_cell(lv['ttfa_ms'], 'p99')} "
            f"| {_cell(lv['rtf'], 'p50')} / {_cell(lv['rtf'], 'p90')} "
            f"| {_cell(lv['e2e_ms'], 'p50')} / {_cell(lv['e2e_ms'], 'p90')} / {_cell(lv['e2e_ms'], 'p99')} "
            f"| {_cell(first, 'ttfa_ms')} / {_cell(first, 'rtf')} "
            f"| {_cell(t, 'output_tokens_per_s')} | {_cell(t, 'requests_per_s')} | {_cell(t, 'audio_s_per_s')} |"
        )
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    where = machine_line(report["machine"])
    cfg = report["config"]
    return "\n".join([
        f"## {report['label']}",
        "",
        f"Command: `{report['command']}`  ",
        f"Date: {report['date']}  ",
        f"Client machine: {where}; server: {report.get('server', '?')}  ",
        f"Workload: prompt set `{cfg['prompt_set']}`, max_tokens {cfg['max_tokens']}, "
        f"audio frames {cfg.get('audio_tokens')}, ignore_eos {cfg['ignore_eos']}, "
        f"modalities {cfg['modalities']}, sampling {cfg.get('sampling', '?')}",
        "",
        markdown_table(report),
        "",
        "Times in ms; RTF = request latency / seconds of audio (lower is better); tok/s = output text "
        "tokens per wall second; audio s/s = seconds of speech delivered per wall second. phase cold: the "
        "first levels after the server started, before any warm-up; warm: after the warm-up.",
        "",
    ])


def plot(reports: list[dict[str, Any]], path: str) -> None:
    """One PNG, four panels against concurrency; one line per report (e.g. omni vs transformers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("time to first audio / text, p50 (ms)", [("ttfa_ms", "p50", "TTFA"), ("ttft_ms", "p50", "TTFT")], True),
        ("RTF p50 (lower is better)", [("rtf", "p50", "RTF")], True),
        ("output tokens / s", [("throughput", "output_tokens_per_s", "tok/s")], False),
        ("end-to-end latency (ms)", [("e2e_ms", "p50", "p50"), ("e2e_ms", "p99", "p99")], True),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (title, series, logy) in zip(axes.flat, panels):
        for report, phase, levels in _by_phase(reports):
            xs = [lv["concurrency"] for lv in levels]
            for key, sub, name in series:
                ys = [(lv.get(key) or {}).get(sub) for lv in levels]
                pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
                if pts:
                    tag = "" if phase in (None, "warm") else f" ({phase})"
                    ax.plot(*zip(*pts), marker="o", linestyle="-" if tag == "" else "--",
                            label=f"{report['label']}{tag} {name}")
        ax.set_title(title)
        ax.set_xlabel("concurrency")
        ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _by_phase(reports: list[dict[str, Any]]):
    """(report, phase, levels of that phase) in order of first appearance: one line per phase."""
    for report in reports:
        phases: dict[Any, list] = {}
        for lv in report["levels"]:
            phases.setdefault(lv.get("phase"), []).append(lv)
        for phase, levels in phases.items():
            yield report, phase, levels


def write_report(report: dict[str, Any], out: str | None, md: str | None, plot_path: str | None) -> dict[str, Any]:
    """Write the JSON / markdown / PNG a run asked for, and print the markdown."""
    write(report, out, md, markdown)
    if plot_path:
        plot([report], plot_path)
    print(markdown(report))
    return report
