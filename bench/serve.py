"""Load generator for any OpenAI-compatible chat server (omnid, vLLM-Omni, SGLang, ...).

Streams `/v1/chat/completions` requests from a fixed prompt set at each concurrency of a sweep
(closed loop: `c` clients, each sends its next request when the previous one ends) and reports,
per level: TTFT, TPOT, time to first audio (TTFA), RTF and end-to-end latency (mean, p50, p90,
p99) and throughput (requests/s, output tokens/s, audio seconds/s). Output lengths are fixed
so that systems are compared on equal work: `max_tokens` + `ignore_eos` (vLLM's extension,
omnid accepts it too) for the text, and with `--omni-ext` (default on) omnid's
`stage_sampling.talker` {max_tokens, ignore_eos} for the number of audio frames.

What users get: by default no sampling parameter is sent (no `temperature`, neither for the text
nor in `stage_sampling.talker`), so the server samples as it does for a client that sets nothing
(Qwen3-Omni's talker: temperature 0.9, top-k 50, repetition penalty 1.05). Output length is not
sampling: `max_tokens` + `ignore_eos` stay. `--greedy` (or `--temperature T`) is the extra line.

Cold and warm: the `--cold` levels (default 1) run first, with no warm-up: against a freshly
started server they are what its first users get. Then `--warmup` requests, then the sweep. Every
level row says its `phase` ("cold" or "warm", or `--phase` for a whole run) and carries its
first request's figures (`first_request`) beside the percentiles.

Run:  python bench/serve.py --url http://127.0.0.1:8000 [--model NAME] [--concurrency 1,4,16,32,64]
          [--cold 1] [--greedy] [--requests N] [--prompt-set short|long|mixed] [--max-tokens 32]
          [--audio-tokens 64] [--modalities text,audio] [--out bench/results/serve.json] [--plot serve.png]
          [--md serve.md]
Progress goes to stderr; the JSON has the command, the client machine and every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_report import level_summary, machine, now_iso, say, write_report  # noqa: E402

PROMPT_SETS: dict[str, list[str]] = {
    "short": [
        "Say hello in one sentence.",
        "What is the capital of France?",
        "Name three colours of the rainbow.",
        "Count from one to five.",
        "What day comes after Monday?",
        "Give me a word that rhymes with cat.",
        "How many legs does a spider have?",
        "Tell me a fun fact about the moon.",
    ],
    "long": [
        "You are a helpful assistant on a phone line. A caller explains that their train was cancelled, "
        "they need to reach the airport in two hours, they have one suitcase and a limited budget, and "
        "they do not know the city. Walk them through their options step by step, weighing cost, time "
        "and risk, and end with a clear recommendation they can act on right away.",
        "Summarise the following for a listener who is driving: the committee met on Tuesday to review "
        "the budget for the coming year. Spending on maintenance rose by eight percent, mostly because "
        "of the bridge repairs that were delayed last spring. The library asked for longer opening "
        "hours, and the parks department proposed planting two hundred trees along the river.",
    ],
}
PROMPT_SETS["mixed"] = [p for pair in zip(PROMPT_SETS["short"], PROMPT_SETS["long"] * 4) for p in pair]


@dataclass
class Workload:
    url: str
    model: str
    prompts: list[str]
    max_tokens: int
    audio_tokens: int | None
    modalities: list[str]
    voice: str | None
    ignore_eos: bool
    temperature: float | None  # None: send none (the server's own sampling); 0.0: greedy
    omni_ext: bool
    sample_rate: int
    timeout_s: float
    api_key: str | None = None
    level_deadline_s: float | None = None  # per level: no new request past it (a time-boxed run keeps its rows)

    def body(self, i: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": self.prompts[i % len(self.prompts)]}],
            "modalities": self.modalities,
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.ignore_eos:
            body["ignore_eos"] = True
        if "audio" in self.modalities:
            if self.voice:  # OpenAI's `audio` needs a voice; without one the server's default speaks pcm16
                body["audio"] = {"voice": self.voice, "format": "pcm16"}
            if self.omni_ext and self.audio_tokens:  # the number of frames: output length, not sampling
                talker: dict[str, Any] = {"max_tokens": self.audio_tokens, "ignore_eos": self.ignore_eos}
                if self.temperature is not None:
                    talker["temperature"] = self.temperature
                body["stage_sampling"] = {"talker": talker}
        return body


async def one_request(session, wl: Workload, i: int) -> dict[str, Any]:
    """Send request `i`, read its SSE stream, time it. Never raises: failures are rows with ok=False."""
    row: dict[str, Any] = {"index": i, "ok": False, "error": None, "ttft_s": None, "tpot_s": None,
                           "ttfa_s": None, "audio_s": None, "output_tokens": None, "latency_s": None}
    headers = {"Authorization": f"Bearer {wl.api_key}"} if wl.api_key else {}
    t0 = time.perf_counter()
    first_text = last_text = first_audio = None
    chunks = audio_bytes = 0
    usage_tokens = None
    try:
        async with session.post(wl.url.rstrip("/") + "/v1/chat/completions", json=wl.body(i), headers=headers) as resp:
            if resp.status != 200:
                row["error"] = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                row["latency_s"] = time.perf_counter() - t0
                return row
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                event = json.loads(payload)
                if "error" in event:
                    raise RuntimeError(f"stream error: {event['error'].get('message', event['error'])}")
                now = time.perf_counter()
                if event.get("usage"):
                    usage_tokens = event["usage"].get("completion_tokens")
                for choice in event.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        chunks += 1
                        first_text = first_text if first_text is not None else now
                        last_text = now
                    data = (delta.get("audio") or {}).get("data")
                    if data:
                        audio_bytes += len(base64.b64decode(data))
                        first_audio = first_audio if first_audio is not None else now
    except Exception as exc:  # a failed request is a result, not a crash of the sweep
        row["error"] = f"{type(exc).__name__}: {exc}"
        row["latency_s"] = time.perf_counter() - t0
        return row
    end = time.perf_counter()
    tokens = usage_tokens if usage_tokens is not None else chunks
    row.update(ok=True, latency_s=end - t0, output_tokens=tokens,
               ttft_s=None if first_text is None else first_text - t0,
               ttfa_s=None if first_audio is None else first_audio - t0)
    if first_text is not None and tokens > 1:
        row["tpot_s"] = (last_text - first_text) / (tokens - 1)
    if "audio" in wl.modalities:
        row["audio_s"] = audio_bytes / 2 / wl.sample_rate  # pcm16 mono
    return row


async def closed_loop(one, concurrency: int, n_requests: int, offset: int = 0,
                      deadline_s: float | None = None) -> tuple[list[dict], float]:
    """`concurrency` clients share requests offset..offset+n_requests-1, each sending its next when
    the previous ends; `one(i)` sends request i and returns its row. Rows by index, wall seconds.
    Past `deadline_s` (from the start) no client sends another request (those in flight finish)."""
    next_i = iter(range(offset, offset + n_requests))
    rows: list[dict] = []
    t0 = time.perf_counter()

    async def client() -> None:
        for i in next_i:
            if deadline_s is not None and i >= offset + concurrency and time.perf_counter() - t0 > deadline_s:
                return
            rows.append(await one(i))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    rows.sort(key=lambda r: r["index"])
    return rows, wall


async def run_level(wl: Workload, concurrency: int, n_requests: int, offset: int = 0) -> tuple[list[dict], float]:
    """One level against the server: a closed loop of streamed chat requests."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=wl.timeout_s)
    connector = aiohttp.TCPConnector(limit=max(concurrency, 1) * 2)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        return await closed_loop(lambda i: one_request(session, wl, i), concurrency, n_requests, offset,
                                 wl.level_deadline_s)


async def detect_model(url: str, api_key: str | None) -> str:
    import aiohttp

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async with session.get(url.rstrip("/") + "/v1/models", headers=headers) as resp:
            resp.raise_for_status()
            return (await resp.json())["data"][0]["id"]


async def sweep(wl: Workload, levels: list[int], requests: int | None, warmup: int, keep_rows: bool,
                cold: list[int] | None = None, phase: str | None = None) -> list[dict]:
    return await sweep_levels(lambda c, n, offset: run_level(wl, c, n, offset), levels, requests, warmup, keep_rows,
                              cold, phase)


def first_request(rows: list[dict]) -> dict[str, Any] | None:
    """The figures of the level's first request (lowest index): on a fresh server, the first user."""
    if not rows:
        return None
    r = min(rows, key=lambda row: row["index"])
    ms = lambda v: None if v is None else round(1000 * v, 2)  # noqa: E731
    return {"index": r["index"], "ok": r["ok"], "ttft_ms": ms(r.get("ttft_s")), "ttfa_ms": ms(r.get("ttfa_s")),
            "e2e_ms": ms(r.get("latency_s")) if r["ok"] else None,
            "rtf": round(r["latency_s"] / r["audio_s"], 4) if r["ok"] and r.get("audio_s") else None}


async def sweep_levels(run, levels: list[int], requests: int | None, warmup: int, keep_rows: bool = False,
                       cold: list[int] | None = None, phase: str | None = None) -> list[dict]:
    """The `cold` levels first (no warm-up before them), then `warmup` requests, then each level:
    `run(concurrency, n, offset)` -> (rows, wall); one summary per level, tagged with its phase."""
    out, offset = [], 0

    async def level(c: int, tag: str) -> None:
        nonlocal offset
        n = requests or max(2 * c, 8)
        say(f"{tag} concurrency {c}: {n} requests ...")
        rows, wall = await run(c, n, offset)
        offset += n
        summary = {"phase": tag, **level_summary(rows, wall, c), "first_request": first_request(rows)}
        if len(rows) < n:
            summary["cut_by_deadline"] = f"{len(rows)} of {n} requests sent before the level's deadline"
        if keep_rows:
            summary["rows"] = rows
        say(f"  ok {summary['ok']}/{n} in {wall:.2f}s; ttft p50 {(summary['ttft_ms'] or {}).get('p50')} ms; "
            f"e2e p50 {(summary['e2e_ms'] or {}).get('p50')} ms; ttfa p50 {(summary['ttfa_ms'] or {}).get('p50')} ms; "
            f"rtf p50 {(summary['rtf'] or {}).get('p50')}")
        out.append(summary)

    for c in cold or ():
        await level(c, phase or "cold")
    if warmup:
        say(f"warm-up: {warmup} request(s)")
        await run(1, warmup, 10**6)
    for c in levels:
        await level(c, phase or "warm")
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="default: the first of /v1/models")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--concurrency", default="1,4,16,32,64", help="comma-separated levels")
    ap.add_argument("--cold", default="1", help="levels run first, before any warm-up ('' for none)")
    ap.add_argument("--phase", default=None, help="tag every level with this phase (default cold / warm)")
    ap.add_argument("--requests", type=int, default=None, help="requests per level (default max(2c, 8))")
    ap.add_argument("--warmup", type=int, default=2, help="requests between the cold levels and the sweep")
    ap.add_argument("--prompt-set", choices=sorted(PROMPT_SETS), default="short")
    ap.add_argument("--max-tokens", type=int, default=32, help="text tokens per request")
    ap.add_argument("--audio-tokens", type=int, default=64, help="talker frames per request (omni extension)")
    ap.add_argument("--modalities", default="text,audio")
    ap.add_argument("--voice", default=None)
    ap.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    ap.add_argument("--temperature", type=float, default=None,
                    help="send this temperature (text and talker); default none: the server's own sampling")
    ap.add_argument("--greedy", action="store_true", help="temperature 0 for text and talker (the extra line)")
    ap.add_argument("--no-omni-ext", dest="omni_ext", action="store_false", help="do not send stage_sampling")
    ap.add_argument("--sample-rate", type=int, default=24000, help="of the streamed pcm16 audio")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request seconds")
    ap.add_argument("--level-deadline-s", type=float, default=None,
                    help="per level: send no new request after this many seconds (the level reports what ended)")
    ap.add_argument("--label", default="server")
    ap.add_argument("--server-note", default="", help="what and where the server is (goes in the report)")
    ap.add_argument("--rows", action="store_true", help="keep every request's row in the JSON")
    ap.add_argument("--out", default=None, help="JSON path")
    ap.add_argument("--plot", default=None, help="PNG path")
    ap.add_argument("--md", default=None, help="markdown path (the table)")
    return ap


def parse_levels(text: str | None) -> list[int]:
    return [int(x) for x in (text or "").split(",") if x.strip()]


def run(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    levels = parse_levels(args.concurrency)
    cold = parse_levels(args.cold)
    if (not levels and not cold) or min(levels + cold) < 1:
        raise SystemExit("--concurrency / --cold need positive integers")
    if args.greedy:
        if args.temperature not in (None, 0.0):
            raise SystemExit("--greedy and --temperature disagree")
        args.temperature = 0.0
    model = args.model or asyncio.run(detect_model(args.url, args.api_key))
    modalities = [m.strip() for m in args.modalities.split(",") if m.strip()]
    wl = Workload(args.url, model, PROMPT_SETS[args.prompt_set], args.max_tokens,
                  args.audio_tokens if "audio" in modalities else None, modalities, args.voice, args.ignore_eos,
                  args.temperature, args.omni_ext, args.sample_rate, args.timeout, args.api_key,
                  args.level_deadline_s)
    sampling = "server default" if args.temperature is None else "greedy" if args.temperature == 0 else f"temperature {args.temperature}"
    say(f"{args.url} model {model!r}: cold levels {cold}, levels {levels}, prompt set {args.prompt_set}, "
        f"modalities {modalities}, sampling {sampling}")
    report = {
        "label": args.label,
        "command": " ".join(["python", "bench/serve.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": now_iso(),
        "machine": machine(),
        "server": args.server_note or args.url,
        "config": {"url": args.url, "model": model, "prompt_set": args.prompt_set, "max_tokens": args.max_tokens,
                   "audio_tokens": wl.audio_tokens, "modalities": modalities, "ignore_eos": args.ignore_eos,
                   "temperature": args.temperature, "sampling": sampling, "omni_ext": args.omni_ext,
                   "warmup": args.warmup, "cold": cold, "requests_per_level": args.requests},
        "levels": asyncio.run(sweep(wl, levels, args.requests, args.warmup, args.rows, cold, args.phase)),
    }
    return write_report(report, args.out, args.md, args.plot)


if __name__ == "__main__":
    run()
