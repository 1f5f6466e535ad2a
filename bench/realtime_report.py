"""bench/realtime.py's figures: a level's turn rows -> per-turn and whole-level percentiles, turn 1
against the last turn, the prefix-cache hit rate per stage and the encoders' cache hit rate from two
/metrics scrapes, and the markdown report (with the issues' targets checked)."""

from __future__ import annotations

import re
from typing import Any

from serve_report import machine_line, stats

LATENCIES = ("eos_to_audio_ms", "stopped_to_audio_ms", "committed_to_audio_ms", "commit_sent_to_audio_ms",
             "eos_to_stopped_ms", "server_ttfa_ms")
RATIO_OF = ("eos_to_audio_ms", "stopped_to_audio_ms")
_METRIC = re.compile(r'^omni_stage_prefix_cache_(hit|queried)_tokens\{stage="([^"]+)"\} (\S+)$')
_ENCODER = re.compile(r'^omni_stage_(cache_hits|encoded)\{stage="([^"]+)"\} (\S+)$')


def _turn_stats(rows: list[dict], turn: int) -> dict[str, Any]:
    ok = [r for r in rows if r["ok"]]
    tokens = sorted(r["input_tokens"] for r in ok if r["input_tokens"] is not None)
    return {"turn": turn, "ok": len(ok), "failed": len(rows) - len(ok),
            **{m: stats([r[m] for r in ok]) for m in LATENCIES},
            "input_tokens_p50": tokens[len(tokens) // 2] if tokens else None}


def level_summary(sessions: list[dict], wall_s: float, n_sessions: int, turns: int) -> dict[str, Any]:
    """One level: every turn's rows pooled per turn index and over all turns."""
    rows = [r for s in sessions for r in s["turns"]]
    ok = [r for r in rows if r["ok"]]
    per_turn = [_turn_stats([r for r in rows if r["turn"] == t], t) for t in range(1, turns + 1)]
    reached = [t for t in per_turn if t["ok"]]
    first, last = (reached[0], reached[-1]) if reached else ({}, {})
    ratio = {}
    for m in RATIO_OF:
        a, b = (first.get(m) or {}).get("p50"), (last.get(m) or {}).get("p50")
        ratio[m] = round(b / a, 3) if a and b is not None else None
    errors: dict[str, int] = {}
    for msg in [e for r in rows for e in r["errors"]] + [s["error"] for s in sessions if s["error"]]:
        errors[msg] = errors.get(msg, 0) + 1
    detection = next((s["turn_detection"] for s in sessions if s.get("turn_detection")), None)
    return {
        "sessions": n_sessions, "turns_per_session": turns, "turns_total": len(rows), "turns_ok": len(ok),
        "turns_planned": n_sessions * turns, "wall_s": round(wall_s, 2),
        "audio_out_s": round(sum(r["audio_s"] for r in ok), 3),
        "vad_split_turns": sum(1 for r in rows if r["detections"] > 1),
        "errors": errors, "turn_detection": detection,
        "all_turns": {m: stats([r[m] for r in ok]) for m in LATENCIES},
        "turn_first": first, "turn_last": last, "last_over_first_p50": ratio, "per_turn": per_turn,
    }


def _scrape(text: str, pattern: re.Pattern = _METRIC) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        m = pattern.match(line)
        if m:
            out.setdefault(m.group(2), {})[m.group(1)] = float(m.group(3))
    return out


def prefix_cache(before: str, after: str) -> dict[str, dict[str, Any]]:
    """{stage: {hit_tokens, queried_tokens, hit_rate}} over the level (tokens found in the cache /
    prompt tokens admitted), from the `omni_stage_prefix_cache_*` gauges of two scrapes."""
    b, a = _scrape(before), _scrape(after)
    out = {}
    for stage, now in sorted(a.items()):
        was = b.get(stage, {})
        hit = now.get("hit", 0.0) - was.get("hit", 0.0)
        queried = now.get("queried", 0.0) - was.get("queried", 0.0)
        if queried > 0:
            out[stage] = {"hit_tokens": int(hit), "queried_tokens": int(queried), "hit_rate": round(hit / queried, 4)}
    return out


def encoder_cache(before: str, after: str) -> dict[str, dict[str, Any]]:
    """{stage: {hits, encoded, hit_rate}} over the level: inputs (audio clips or windows, images) an
    encoder stage found in its cache over all it was given, from two scrapes."""
    b, a = _scrape(before, _ENCODER), _scrape(after, _ENCODER)
    out = {}
    for stage, now in sorted(a.items()):
        was = b.get(stage, {})
        hits = now.get("cache_hits", 0.0) - was.get("cache_hits", 0.0)
        encoded = now.get("encoded", 0.0) - was.get("encoded", 0.0)
        if hits + encoded > 0:
            out[stage] = {"hits": int(hits), "encoded": int(encoded), "hit_rate": round(hits / (hits + encoded), 4)}
    return out


def _p(d: dict | None, key: str = "p50") -> str:
    return "–" if not d or d.get(key) is None else f"{d[key]:,.0f}"


def _pp(d: dict | None) -> str:
    return f"{_p(d)} / {_p(d, 'p90')}"


def detection_note(report: dict[str, Any]) -> str:
    cfg = report["config"]
    got = cfg.get("turn_detection") or {}
    what = (f"server_vad threshold {got.get('threshold')}, silence_duration_ms {got.get('silence_duration_ms')}, "
            f"early_silence_ms {got.get('early_silence_ms')}, prefix_padding_ms {got.get('prefix_padding_ms')}")
    if got.get("type") == "semantic_vad":
        what = f"semantic_vad eagerness {got.get('eagerness')}"
    if not got:
        what = "unknown (no session reported it)"
    if cfg.get("turn_detection_sent") is None:
        return f"{what}: the server's default, what users get (the client sent no turn_detection)"
    return f"{what}: set by the client (`--silence-ms`), not the server's default"


def targets(report: dict[str, Any]) -> list[str]:
    """The issue's two targets against the warm levels."""
    out = []
    for lv in report["levels"]:
        if lv["phase"] != "warm":
            continue
        if lv.get("commit") == "manual":
            out += manual_targets(lv)
            continue
        r = lv["last_over_first_p50"].get("eos_to_audio_ms")
        if r is not None:
            verdict = "met" if r <= 1.10 else "missed"
            out.append(f"- {lv['sessions']} session(s): turn {lv['turn_last'].get('turn')} / turn 1 end of speech -> "
                       f"first audio p50 = {r:.2f} (target <= 1.10: {verdict})")
        if lv["sessions"] == 8:
            eos, stop = lv["all_turns"]["eos_to_audio_ms"], lv["all_turns"]["stopped_to_audio_ms"]
            if eos:
                out.append(f"- 8 sessions: end of speech -> first audio p50 {eos['p50']:,.0f} ms, "
                           f"p90 {eos['p90']:,.0f} ms "
                           f"(target <= 300: {'met' if eos['p50'] <= 300 else 'missed'}); from speech_stopped "
                           f"p50 {_p(stop)} ms (the VAD's silence wait excluded)")
    return out


def manual_targets(lv: dict[str, Any]) -> list[str]:
    """Issue 26: commit -> first audio p50 <= 150 ms (1 session) / 300 ms (8) on every turn, turn 10
    within 1.2x of turn 2; p90 <= 500 ms at 32."""
    per = {t["turn"]: t["committed_to_audio_ms"] for t in lv["per_turn"] if t["committed_to_audio_ms"]}
    if not per:
        return []
    n, out = lv["sessions"], []
    worst = max(d["p50"] for d in per.values())
    limit = {1: 150, 8: 300}.get(n)
    if limit:
        out.append(f"- manual commit, {n} session(s): worst turn's commit -> first audio p50 {worst:,.0f} ms "
                   f"(target <= {limit} on every turn: {'met' if worst <= limit else 'missed'})")
    if 2 in per and 10 in per:
        r = per[10]["p50"] / per[2]["p50"]
        out.append(f"- manual commit, {n} session(s): turn 10 / turn 2 p50 = {r:.2f} (target <= 1.2: "
                   f"{'met' if r <= 1.2 else 'missed'})")
    if n == 32:
        p90 = lv["all_turns"]["committed_to_audio_ms"]["p90"]
        out.append(f"- manual commit, 32 sessions: commit -> first audio p90 {p90:,.0f} ms (target <= 500: "
                   f"{'met' if p90 <= 500 else 'missed'})")
    return out


def _phase(lv: dict[str, Any]) -> str:
    return lv["phase"] + (" manual" if lv.get("commit") == "manual" else "")


def markdown(report: dict[str, Any]) -> str:
    m, cfg = report["machine"], report["config"]
    where = machine_line(m)
    where += f", {m['gpu']}" if "gpu" in m else ""
    head = ("| phase | sessions | turns ok/planned | EoS->audio p50/p90 turn 1 | last turn | last/1 | "
            "stopped->audio p50/p90 turn 1 | last turn | last/1 | EoS->stopped p50 | all turns EoS->audio p50/p90 | "
            "audio out s | errors | prefix-cache hit rate | encoder cache hit rate |")
    lines = [f"## {report['label']}", "",
             f"Command: `{report['command']}`  ", f"Date: {report['date']}  ",
             f"Client machine: {where}; server: {report.get('server', '?')}  ",
             f"Workload: {cfg['turns']} spoken turns per session ({cfg.get('level_turns') or 'every level'}), "
             f"pace {cfg['pace']} ({cfg['chunk_ms']} ms appends), answers of {cfg['max_tokens']} text tokens and "
             f"{cfg['audio_tokens']} talker frames (ignore_eos), sampling {cfg['sampling']}, "
             f"{cfg['gap_s']} s between an answer and the next turn, sessions staggered over {cfg['stagger_s']} s  ",
             f"Turn detection: {detection_note(report)}", "", head, "|" + "---|" * (head.count("|") - 1)]
    for lv in report["levels"]:
        t1, tl, r = lv["turn_first"], lv["turn_last"], lv["last_over_first_p50"]
        hits = ", ".join(f"{s} {v['hit_rate']:.0%}" for s, v in lv["prefix_cache"].items()) or "–"
        errs = sum(lv["errors"].values())
        enc = ", ".join(f"{s} {v['hit_rate']:.0%}" for s, v in lv.get("encoder_cache", {}).items()) or "–"
        lines.append(
            f"| {_phase(lv)} | {lv['sessions']} | {lv['turns_ok']}/{lv['turns_planned']} "
            f"| {_pp(t1.get('eos_to_audio_ms'))} | {_pp(tl.get('eos_to_audio_ms'))} (turn {tl.get('turn', '–')}) "
            f"| {r['eos_to_audio_ms'] if r['eos_to_audio_ms'] is not None else '–'} "
            f"| {_pp(t1.get('stopped_to_audio_ms'))} | {_pp(tl.get('stopped_to_audio_ms'))} "
            f"| {r['stopped_to_audio_ms'] if r['stopped_to_audio_ms'] is not None else '–'} "
            f"| {_p(lv['all_turns']['eos_to_stopped_ms'])} | {_pp(lv['all_turns']['eos_to_audio_ms'])} "
            f"| {lv['audio_out_s']:.2f} | {errs} | {hits} | {enc} |")
    turns = max((lv["turns_per_session"] for lv in report["levels"]), default=0)
    lines += ["", "End of speech -> first audio p50/p90 over sessions (ms) at each turn:", "",
              "| phase | sessions | " + " | ".join(f"turn {t}" for t in range(1, turns + 1)) + " |",
              "|" + "---|" * (turns + 2)]
    for lv in report["levels"]:
        cells = [_pp(t["eos_to_audio_ms"]) for t in lv["per_turn"]] + ["–"] * (turns - len(lv["per_turn"]))
        lines.append(f"| {_phase(lv)} | {lv['sessions']} | " + " | ".join(cells) + " |")
    lines += ["", "Commit -> first audio p50/p90 (ms) at each turn (the server's own part: no VAD wait):", "",
              "| phase | sessions | " + " | ".join(f"turn {t}" for t in range(1, turns + 1)) + " |",
              "|" + "---|" * (turns + 2)]
    for lv in report["levels"]:
        cells = [_pp(t["committed_to_audio_ms"]) for t in lv["per_turn"]] + ["–"] * (turns - len(lv["per_turn"]))
        lines.append(f"| {_phase(lv)} | {lv['sessions']} | " + " | ".join(cells) + " |")
    errors = {e: n for lv in report["levels"] for e, n in lv["errors"].items()}
    lines += ["", "Targets (warm levels):", "", *(targets(report) or ["- no warm level measured"])]
    if errors:
        lines += ["", "Errors:", "", *(f"- {n} x {e}" for e, n in errors.items())]
    lines += ["", "Times in ms. EoS = end of the user's speech: the moment the append holding its last speech sample "
              "was sent (at real-time pace, when a microphone would have recorded it). stopped = the client "
              "received `input_audio_buffer.speech_stopped` (the server VAD's silence wait is over). audio = the "
              "first `response.audio.delta`. commit: the server's `input_audio_buffer.committed` as received (phase "
              "'manual': turn detection off, the client commits at end of speech, so EoS -> audio is commit -> "
              "audio seen by the client). last/1 = p50 at the last turn reached over p50 at turn 1. Encoder cache "
              "hit rate: inputs (audio clips or attention windows) an encoder found encoded over all it was given. "
              "Prefix-cache "
              "hit rate: prompt tokens each stage found in its cache over those it admitted during the level "
              "(/metrics before and after). phase cold: the first level on a freshly started server, before any "
              "warm-up; warm: after it.", ""]
    return "\n".join(lines)
