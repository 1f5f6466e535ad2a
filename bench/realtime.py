"""Voice conversations against omnid's /v1/realtime: sessions of spoken turns at several concurrency
levels, timed from the end of the user's speech to the first audio of the answer.

Each session opens a WebSocket (the beta dialect: `response.audio.delta`), sets only the answer's
length (`stage_sampling`: thinker tokens and talker frames with ignore_eos, so that every turn does
equal work; that is output length, not sampling) and then talks: turn k streams utterance k
(bench/data/realtime/, pcm16 24 kHz) like a microphone, at real-time pace by default (`--pace fast`:
as fast as the socket takes it), keeps streaming silence until the server's VAD ends the turn and the
answer is done, then waits `--gap-s` and speaks the next. No sampling parameter and no turn detection
is sent: the server's defaults are what users get (`--silence-ms N` sets server_vad's
silence_duration_ms, reported beside the figures). Per turn: end of speech (after the append that
held the last speech sample) -> first `response.audio.delta`, and the same from the
`input_audio_buffer.speech_stopped` and `committed` events; per level p50/p90 at each turn, turn 1
vs the last turn, audio seconds out, errors, and each stage's prefix-cache hit rate over the level
(omnid's /metrics before and after; with one session, also around each turn). The `--cold` levels
run first on a fresh server, then a warm-up session, then `--sessions`.

`--commit manual` (issue 26's measurement): turn detection off, the client commits right after the
append holding the last speech sample and asks for the answer, so commit -> first audio is the
server's part alone (its audio encoded while streamed, earlier turns reused); `--commit manual,vad`
runs every level both ways from one command. Each level also reports the audio encoder's cache hit
rate (clips, or windows of a clip, found encoded: /metrics `omni_stage_cache_hits` over those plus
`omni_stage_encoded`).

Run:  python bench/realtime.py --url http://127.0.0.1:8000 [--sessions 1,8,32] [--cold 1] [--turns 10]
          [--pace realtime|fast] [--silence-ms N] [--max-tokens 32] [--audio-tokens 64] [--commit manual,vad]
          [--out realtime.json] [--md realtime.md]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from realtime_report import encoder_cache, level_summary, markdown, prefix_cache  # noqa: E402
from realtime_speech import RATE, load_utterances  # noqa: E402
from report import machine, now_iso, say  # noqa: E402

BYTES_PER_S = 2 * RATE


@dataclass
class Workload:
    url: str
    model: str
    utterances: list[bytes]
    turns: int
    pace: str  # "realtime" | "fast"
    chunk_ms: int
    lead_ms: int
    gap_s: float
    silence_ms: int | None  # None: the server's own turn detection
    max_tokens: int
    audio_tokens: int
    turn_timeout_s: float
    stagger_s: float
    api_key: str | None = None
    level_deadline_s: float | None = None
    commit: str = "vad"  # "vad": the server's turn detection; "manual": off, the client commits at end of speech

    @property
    def chunk_bytes(self) -> int:
        return self.chunk_ms * BYTES_PER_S // 1000

    def session_update(self) -> dict:
        lengths = {"thinker": {"max_tokens": self.max_tokens, "ignore_eos": True},
                   "talker": {"max_tokens": self.audio_tokens, "ignore_eos": True}}
        session: dict[str, Any] = {"stage_sampling": lengths}
        if self.commit == "manual":
            session["turn_detection"] = None
        elif self.silence_ms is not None:
            session["turn_detection"] = {"type": "server_vad", "silence_duration_ms": self.silence_ms}
        return {"type": "session.update", "session": session}

    def turn_audio(self, k: int, session: int = 0) -> tuple[bytes, int]:
        """Lead silence + utterance k, the speech ending on a chunk boundary; and the byte count up to
        the end of the chunk holding the last speech sample. Each session's copy differs by a seeded
        +-1 LSB dither (inaudible), so no session finds another's audio in the servers' caches."""
        speech = _dithered(self.utterances[k % len(self.utterances)], session)
        c = self.chunk_bytes
        total = -(-(self.lead_ms * BYTES_PER_S // 1000 + len(speech)) // c) * c
        return bytes(total - len(speech)) + speech, total


def _dithered(pcm16: bytes, seed: int) -> bytes:
    import numpy as np

    x = np.frombuffer(pcm16, "<i2").astype(np.int32)
    x += np.random.default_rng(seed).integers(-1, 2, len(x))
    return np.clip(x, -32768, 32767).astype("<i2").tobytes()


@dataclass
class Turn:
    """One spoken turn: perf_counter stamps of what the client did and saw."""

    index: int
    speech_s: float
    speech_end: float | None = None
    started: float | None = None
    stopped: float | None = None
    committed: float | None = None
    commit_sent: float | None = None  # manual commit: when the client sent it
    first_audio: float | None = None
    done_at: float | None = None
    audio_bytes: int = 0
    status: str | None = None
    input_tokens: int | None = None
    server_ttfa_s: float | None = None
    detections: int = 0  # speech_stopped events in this turn (more than 1: the VAD split it)
    responses: int = 0
    errors: list[str] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def row(self) -> dict[str, Any]:
        def ms(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round(1000 * (a - b), 2)

        ok = self.status in ("completed", "incomplete") and self.first_audio is not None and not self.errors
        return {"turn": self.index + 1, "ok": ok, "status": self.status, "errors": self.errors,
                "speech_s": round(self.speech_s, 3),
                "eos_to_audio_ms": ms(self.first_audio, self.speech_end),
                "stopped_to_audio_ms": ms(self.first_audio, self.stopped),
                "committed_to_audio_ms": ms(self.first_audio, self.committed),
                "commit_sent_to_audio_ms": ms(self.first_audio, self.commit_sent),
                "eos_to_stopped_ms": ms(self.stopped, self.speech_end),
                "server_ttfa_ms": None if self.server_ttfa_s is None else round(1000 * self.server_ttfa_s, 2),
                "audio_s": round(self.audio_bytes / BYTES_PER_S, 3), "input_tokens": self.input_tokens,
                "detections": self.detections, "responses": self.responses}


class Session:
    """One conversation: a reader task stamps the server's events onto the turn in progress."""

    def __init__(self, ws, wl: Workload, scrape=None, index: int = 0) -> None:
        self.ws, self.wl, self.index = ws, wl, index
        self.scrape = scrape  # alone on the server: /metrics around each turn (its own prefix-cache hits)
        self.turn: Turn | None = None
        self.errors: list[str] = []
        self.session: dict | None = None  # the settings the server reports after our update
        self.updated = asyncio.Event()
        self._sent_bytes = 0
        self._mic_t0 = 0.0

    async def read(self) -> None:
        from aiohttp import WSMsgType

        async for msg in self.ws:
            if msg.type != WSMsgType.TEXT:
                break
            self.on(json.loads(msg.data), time.perf_counter())
        if self.turn is not None and not self.turn.done.is_set():
            self.turn.errors.append(f"socket closed ({self.ws.close_code})")
            self.turn.done.set()

    def on(self, ev: dict, now: float) -> None:
        kind, t = ev.get("type"), self.turn
        if kind == "session.updated":
            self.session = ev["session"]
            self.updated.set()
        elif kind == "error":
            message = f"{ev['error'].get('code')}: {ev['error'].get('message')}"[:200]
            (t.errors if t is not None else self.errors).append(message)
            if t is None:
                self.updated.set()  # a refused update: the caller sees the error
        elif t is None:
            return
        elif kind == "input_audio_buffer.speech_started":
            t.started = t.started or now
        elif kind == "input_audio_buffer.speech_stopped":
            t.detections += 1
            t.stopped = t.stopped or now
        elif kind == "input_audio_buffer.committed":
            t.committed = t.committed or now
        elif kind == "response.created":
            t.responses += 1
        elif kind == "response.audio.delta":
            t.first_audio = t.first_audio or now
            t.audio_bytes += len(base64.b64decode(ev["delta"]))
        elif kind == "response.done":
            response = ev["response"]
            t.status, t.done_at = response["status"], now
            if response["status"] not in ("completed", "incomplete"):
                details = response.get("status_details") or {}
                t.errors.append(f"response {response['status']}: {details.get('reason') or details}")
            t.input_tokens = (response.get("usage") or {}).get("input_tokens")
            t.server_ttfa_s = (response.get("omni") or {}).get("time_to_first_audio_s")
            t.done.set()

    async def send_audio(self, pcm: bytes) -> None:
        """One append; at real-time pace, only once the microphone would have recorded it."""
        if self.wl.pace == "realtime":
            due = self._mic_t0 + (self._sent_bytes + len(pcm)) / BYTES_PER_S
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
        await self.ws.send_str(json.dumps({"type": "input_audio_buffer.append",
                                           "audio": base64.b64encode(pcm).decode()}))
        self._sent_bytes += len(pcm)

    async def speak(self, k: int) -> Turn:
        wl = self.wl
        audio, speech_end = wl.turn_audio(k, self.index)
        turn = self.turn = Turn(k, len(wl.utterances[k % len(wl.utterances)]) / BYTES_PER_S)
        c = wl.chunk_bytes
        for i in range(0, len(audio), c):
            await self.send_audio(audio[i:i + c])
            if i + c == speech_end:
                turn.speech_end = time.perf_counter()
        limit = time.perf_counter() + wl.turn_timeout_s
        silence = bytes(c)
        if wl.commit == "manual":  # the client ends the turn itself: nothing more goes into the buffer
            turn.commit_sent = time.perf_counter()
            await self.ws.send_str(json.dumps({"type": "input_audio_buffer.commit"}))
            await self.ws.send_str(json.dumps({"type": "response.create"}))
            try:
                await asyncio.wait_for(turn.done.wait(), wl.turn_timeout_s)
            except TimeoutError:
                pass
        elif wl.pace == "fast":  # enough silence for any VAD setting to end the turn, then wait
            for _ in range(-(-(max(wl.silence_ms or 0, 500) + 500) // wl.chunk_ms)):
                await self.send_audio(silence)
        while wl.commit != "manual" and not turn.done.is_set() and time.perf_counter() < limit:  # the mic runs on
            if wl.pace == "realtime":
                await self.send_audio(silence)
            else:
                try:
                    await asyncio.wait_for(turn.done.wait(), limit - time.perf_counter())
                except TimeoutError:
                    pass
        if not turn.done.is_set():
            turn.errors.append(f"no response.done within {wl.turn_timeout_s:g} s of the end of speech "
                               f"(speech_stopped {'seen' if turn.stopped else 'never seen'})")
        gap_end = time.perf_counter() + wl.gap_s
        while wl.pace == "realtime" and wl.commit != "manual" and time.perf_counter() < gap_end:
            await self.send_audio(silence)
        if wl.pace == "fast" or wl.commit == "manual":
            await asyncio.sleep(wl.gap_s)
            self._mic_t0 = time.perf_counter() - self._sent_bytes / BYTES_PER_S  # the mic was off meanwhile
        self.turn = None
        return turn

    async def converse(self, level_t0: float) -> list[dict]:
        wl = self.wl
        await self.ws.send_str(json.dumps(wl.session_update()))
        await asyncio.wait_for(self.updated.wait(), 30)
        if self.errors:
            raise RuntimeError(f"session.update refused: {self.errors}")
        self._mic_t0 = time.perf_counter()
        rows = []
        for k in range(wl.turns):
            if k and wl.level_deadline_s is not None and time.perf_counter() - level_t0 > wl.level_deadline_s:
                break
            before = await self.scrape() if self.scrape else None
            turn = await self.speak(k)
            rows.append(turn.row())
            if self.scrape:
                rows[-1]["prefix_cache"] = prefix_cache(before, await self.scrape())
            if turn.done_at is None:  # the conversation is in an unknown state: end it
                break
        return rows


async def run_session(http, wl: Workload, i: int, delay: float, level_t0: float, alone: bool) -> dict[str, Any]:
    """One session's rows; never raises (a failure is the session's error)."""
    await asyncio.sleep(delay)
    url = wl.url.replace("http", "ws", 1).rstrip("/") + f"/v1/realtime?model={wl.model}"
    headers = {"OpenAI-Beta": "realtime=v1", **({"Authorization": f"Bearer {wl.api_key}"} if wl.api_key else {})}
    out: dict[str, Any] = {"session": i, "turns": [], "error": None, "turn_detection": None}
    try:
        async with http.ws_connect(url, headers=headers, max_msg_size=0, heartbeat=30) as ws:
            session = Session(ws, wl, (lambda: scrape(http, wl)) if alone else None, i)
            reader = asyncio.create_task(session.read())
            try:
                out["turns"] = await session.converse(level_t0)
            finally:
                out["turn_detection"] = (session.session or {}).get("turn_detection")
                reader.cancel()
    except Exception as exc:  # one failed session is a result, not a crash of the level
        out["error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


async def scrape(http, wl: Workload) -> str:
    headers = {"Authorization": f"Bearer {wl.api_key}"} if wl.api_key else {}
    try:
        async with http.get(wl.url.rstrip("/") + "/metrics", headers=headers) as resp:
            return await resp.text() if resp.status == 200 else ""
    except Exception:  # without metrics the level's latencies still stand
        return ""


async def run_level(wl: Workload, sessions: int, turns: int, phase: str) -> dict[str, Any]:
    import aiohttp

    wl = Workload(**{**wl.__dict__, "turns": turns})
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
        before = await scrape(http, wl)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(run_session(http, wl, i, i * wl.stagger_s / sessions, t0, sessions == 1)
                                         for i in range(sessions)))
        wall = time.perf_counter() - t0
        after = await scrape(http, wl)
    return {"phase": phase, "commit": wl.commit, **level_summary(results, wall, sessions, turns),
            "prefix_cache": prefix_cache(before, after), "encoder_cache": encoder_cache(before, after),
            "sessions_detail": results}


async def detect_model(url: str, api_key: str | None) -> str:
    import aiohttp

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        async with http.get(url.rstrip("/") + "/v1/models", headers=headers) as resp:
            resp.raise_for_status()
            return (await resp.json())["data"][0]["id"]


async def sweep(wl: Workload, levels: list[int], cold: list[int], turns_at: dict[int, int],
                warmup_turns: int, on_level=lambda rows: None, commits: tuple[str, ...] = ("vad",)) -> list[dict]:
    """The cold levels, the warm-up session, the warm levels (each level once per commit mode);
    `on_level(rows so far)` after each (a run killed at its time limit keeps the levels it finished)."""
    out: list[dict] = []

    async def level(c: int, phase: str) -> None:
        for commit in commits:
            await one(c, phase, Workload(**{**wl.__dict__, "commit": commit}))

    async def one(c: int, phase: str, wl: Workload) -> None:
        turns = turns_at.get(c, wl.turns)
        say(f"{phase} level ({wl.commit} commit): {c} session(s) x {turns} turns ...")
        row = await run_level(wl, c, turns, phase)
        t1, tl = row["turn_first"], row["turn_last"]
        say(f"  turns ok {row['turns_ok']}/{row['turns_total']} in {row['wall_s']}s; end of speech -> audio p50 "
            f"turn 1 {(t1.get('eos_to_audio_ms') or {}).get('p50')} ms, turn {tl.get('turn')} "
            f"{(tl.get('eos_to_audio_ms') or {}).get('p50')} ms; speech_stopped -> audio p50 "
            f"{(row['all_turns'].get('stopped_to_audio_ms') or {}).get('p50')} ms; commit -> audio p50/p90 "
            f"{(row['all_turns'].get('committed_to_audio_ms') or {}).get('p50')}/"
            f"{(row['all_turns'].get('committed_to_audio_ms') or {}).get('p90')} ms; prefix cache "
            f"{ {k: v['hit_rate'] for k, v in row['prefix_cache'].items()} }; encoder cache "
            f"{ {k: v['hit_rate'] for k, v in row['encoder_cache'].items()} }")
        out.append(row)
        on_level(out)

    for c in cold:
        await level(c, "cold")
    if warmup_turns:
        say(f"warm-up: 1 session x {warmup_turns} turns")
        await run_level(wl, 1, warmup_turns, "warmup")
    for c in levels:
        await level(c, "warm")
    return out


def parse_levels(text: str | None) -> list[int]:
    return [int(x) for x in (text or "").split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="default: the first of /v1/models")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--sessions", default="1,8,32", help="warm levels: concurrent sessions, comma-separated")
    ap.add_argument("--cold", default="1", help="levels run first on a fresh server, before any warm-up ('' for none)")
    ap.add_argument("--turns", type=int, default=10, help="spoken turns per session")
    ap.add_argument("--level-turns", default="", metavar="C=N,...", help="fewer turns at some levels, e.g. 32=6")
    ap.add_argument("--warmup-turns", type=int, default=2, help="one session's turns between cold and warm levels")
    ap.add_argument("--pace", choices=("realtime", "fast"), default="realtime",
                    help="stream the user's audio as a microphone would (default) or as fast as possible")
    ap.add_argument("--chunk-ms", type=int, default=40, help="audio per input_audio_buffer.append")
    ap.add_argument("--lead-ms", type=int, default=300, help="silence before each utterance (at least)")
    ap.add_argument("--gap-s", type=float, default=0.5, help="after an answer is done, before the next turn")
    ap.add_argument("--silence-ms", type=int, default=None,
                    help="set server_vad's silence_duration_ms (default: send none; the server's own setting)")
    ap.add_argument("--max-tokens", type=int, default=32, help="text tokens per answer (ignore_eos)")
    ap.add_argument("--audio-tokens", type=int, default=64, help="talker frames per answer (ignore_eos)")
    ap.add_argument("--stagger-s", type=float, default=2.0, help="session i starts i*stagger/c seconds in")
    ap.add_argument("--turn-timeout-s", type=float, default=120.0, help="end of speech to response.done, at most")
    ap.add_argument("--level-deadline-s", type=float, default=None,
                    help="per level: no session starts a new turn after this many seconds")
    ap.add_argument("--commit", default="vad", help="vad (the server's turn detection), manual (off: the client "
                    "commits at end of speech), or both: manual,vad (every level once each)")
    ap.add_argument("--data", default=None, help="folder of the user's WAVs (default bench/data/realtime)")
    ap.add_argument("--label", default="omnid-realtime")
    ap.add_argument("--server-note", default="", help="what and where the server is (goes in the report)")
    ap.add_argument("--out", default=None, help="JSON path")
    ap.add_argument("--md", default=None, help="markdown path")
    return ap


def run(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    levels, cold = parse_levels(args.sessions), parse_levels(args.cold)
    if (not levels and not cold) or min(levels + cold) < 1 or args.turns < 1:
        raise SystemExit("--sessions / --cold need positive integers, --turns at least 1")
    commits = tuple(m.strip() for m in args.commit.split(",") if m.strip())
    if not commits or not set(commits) <= {"vad", "manual"}:
        raise SystemExit(f"--commit takes vad, manual or both (comma-separated), not {args.commit!r}")
    turns_at = {int(c): int(n) for c, n in (p.split("=") for p in args.level_turns.split(",") if p.strip())}
    model = args.model or asyncio.run(detect_model(args.url, args.api_key))
    utterances = load_utterances(Path(args.data)) if args.data else load_utterances()
    wl = Workload(args.url, model, utterances, args.turns, args.pace, args.chunk_ms, args.lead_ms, args.gap_s,
                  args.silence_ms, args.max_tokens, args.audio_tokens, args.turn_timeout_s, args.stagger_s,
                  args.api_key, args.level_deadline_s)
    say(f"{args.url} model {model!r}: cold {cold}, levels {levels}, {args.turns} turns, pace {args.pace}, "
        f"turn detection {'server default' if args.silence_ms is None else f'silence_duration_ms {args.silence_ms}'}")
    report: dict[str, Any] = {
        "label": args.label,
        "command": " ".join(["python", "bench/realtime.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": now_iso(), "machine": machine(), "server": args.server_note or args.url,
        "config": {"url": args.url, "model": model, "turns": args.turns, "level_turns": turns_at, "pace": args.pace,
                   "chunk_ms": args.chunk_ms, "lead_ms": args.lead_ms, "gap_s": args.gap_s,
                   "stagger_s": args.stagger_s, "max_tokens": args.max_tokens, "audio_tokens": args.audio_tokens,
                   "ignore_eos": True, "sampling": "server default (none sent)",
                   "audio_per_session": "each session's utterances dithered by +-1 LSB (seeded): no shared clips",
                   "turn_detection_sent": wl.session_update()["session"].get("turn_detection"),
                   "utterances_s": [round(len(u) / BYTES_PER_S, 3) for u in utterances],
                   "cold": cold, "sessions": levels, "warmup_turns": args.warmup_turns, "commit": list(commits)},
        "levels": [],
    }

    def write(levels: list[dict]) -> str:
        report["levels"] = levels
        report["config"]["turn_detection"] = next((lv["turn_detection"] for lv in levels if lv.get("turn_detection")),
                                                  None)
        text = markdown(report)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        if args.md:
            Path(args.md).write_text(text)
        return text

    print(write(asyncio.run(sweep(wl, levels, cold, turns_at, args.warmup_turns, write, commits))))
    return report


if __name__ == "__main__":
    run()
