"""Soak: mixed traffic against omnid for a chosen time, RSS and open fds of every process sampled,
first minute vs last minute reported (issue 25: does the thinker grow under mixed traffic?).

Starts `omnid serve` (the embedded tiny default model unless --model; or --url for a running one),
then `--clients` closed-loop clients cycle through the request kinds of `--mix`: text chat, chat
with audio in, chat with speech out (bench/serve.py's streamed request), transcriptions, a
Realtime text turn answered in speech. Every `--sample-s` the RSS and fd count of omnid and each
stage process are read (psutil when installed, else /proc). `--census` sets $OMNI_CENSUS_DIR
and sends every stage and omnid itself SIGUSR1, one process at a time, after the first minute (then
every `--census-every` seconds, when set) and at the end (omni/census.py: objects by
type, torch tensors, glibc heap in use vs taken, RSS after malloc_trim): the difference says leak
(objects / tensors / heap in use grow) or allocator high-water (only RSS grows, the trim gives it
back).

Run:  python bench/soak.py [--duration 600] [--clients 4] [--mix text,audio_in,speech,transcribe,realtime]
          [--census [--census-every S]] [--model DIR] [--url URL] [--out bench/results/soak.json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve import Workload, detect_model, one_request  # noqa: E402
from report import machine, now_iso, say  # noqa: E402
from suite_support import ROOT, child_env, free_port, health_ok, kill_group, last_line  # noqa: E402

KINDS = ("text", "audio_in", "speech", "transcribe", "realtime")
MINUTE = 60.0


def process_figures(pid: int) -> tuple[int, int] | None:
    """(RSS bytes, open fds) of a process, None once it is gone."""
    try:
        import psutil

        proc = psutil.Process(pid)
        return proc.memory_info().rss, proc.num_fds()
    except ImportError:
        pass
    except Exception:
        return None
    try:
        from omni.census import rss_bytes

        return rss_bytes(pid), len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def stage_pids(metrics: str) -> dict[str, int]:
    return {m.group(1): int(float(m.group(2))) for m in re.finditer(r'omni_stage_pid\{stage="([^"]+)"\} (\S+)', metrics)}


def stage_restarts(metrics: str) -> dict[str, int]:
    return {m.group(1): int(float(m.group(2)))
            for m in re.finditer(r'omni_stage_restarts_total\{stage="([^"]+)"\} (\S+)', metrics)}


def wav_b64(seconds: float = 1.0, rate: int = 16000) -> str:
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


class Traffic:
    """One request of each kind; each returns None when it went well, else the error."""

    def __init__(self, http, url: str, model: str, tokens: int) -> None:
        self.http, self.url, self.model, self.tokens = http, url, model, tokens
        common = dict(url=url, model=model, prompts=["Tell me about the sea."], max_tokens=tokens, audio_tokens=tokens,
                      voice=None, ignore_eos=True, temperature=None, omni_ext=True, sample_rate=24000, timeout_s=120)
        self.text_workload = Workload(modalities=["text"], **common)
        self.speech_workload = Workload(modalities=["text", "audio"], **common)
        self.wav = wav_b64()

    async def run(self, kind: str, i: int) -> str | None:
        try:
            return await getattr(self, kind)(i)
        except Exception as exc:  # a failed request is a count, not the end of the soak
            return f"{type(exc).__name__}: {exc}"[:200]

    async def chat(self, wl: Workload, i: int) -> str | None:
        row = await one_request(self.http, wl, i)
        return None if row["ok"] else row["error"]

    async def text(self, i: int) -> str | None:
        return await self.chat(self.text_workload, i)

    async def speech(self, i: int) -> str | None:
        return await self.chat(self.speech_workload, i)

    async def audio_in(self, i: int) -> str | None:
        body = {"model": self.model, "max_tokens": self.tokens, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What do you hear?"},
            {"type": "input_audio", "input_audio": {"data": self.wav, "format": "wav"}}]}]}
        async with self.http.post(self.url + "/v1/chat/completions", json=body) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}: {(await resp.text())[:200]}"

    async def transcribe(self, i: int) -> str | None:
        import aiohttp

        form = aiohttp.FormData()
        form.add_field("model", "whisper-1")
        form.add_field("file", base64.b64decode(self.wav), filename="a.wav", content_type="audio/wav")
        async with self.http.post(self.url + "/v1/audio/transcriptions", data=form) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}: {(await resp.text())[:200]}"

    async def realtime(self, i: int) -> str | None:
        ws_url = self.url.replace("http://", "ws://") + f"/v1/realtime?model={self.model}"
        async with self.http.ws_connect(ws_url) as ws:
            await ws.send_json({"type": "session.update", "session": {"turn_detection": None}})
            await ws.send_json({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                "content": [{"type": "input_text", "text": "Hello there."}]}})
            await ws.send_json({"type": "response.create", "response": {"max_output_tokens": self.tokens}})
            async for msg in ws:
                event = json.loads(msg.data)
                if event["type"] == "error":
                    return f"realtime: {event['error'].get('message')}"[:200]
                if event["type"] == "response.done":
                    return None
        return "realtime: socket closed before response.done"


def minute_figures(samples: list[dict], duration: float) -> dict[str, Any]:
    """Per process: mean RSS (MB) and fds in the first and the last minute, the peak, the change;
    and the second minute's RSS with the change from it: the first minute holds the idle server's
    first sample and every first use (lazy imports, warm-up), so a process that only warmed up shows
    a change from the first minute and none from the second (a leak shows both)."""
    out = {}
    names = sorted({name for s in samples for name in s["procs"]})
    for name in names:
        rows = [(s["t"], *s["procs"][name]) for s in samples if name in s["procs"]]
        first = [r for r in rows if r[0] < MINUTE] or rows[:1]
        second = [r for r in rows if MINUTE <= r[0] < 2 * MINUTE]
        last = [r for r in rows if r[0] >= duration - MINUTE] or rows[-1:]
        mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
        out[name] = {"rss_mb_first_min": round(mean(first, 1) / 2**20, 1),
                     "rss_mb_last_min": round(mean(last, 1) / 2**20, 1),
                     "rss_mb_change": round((mean(last, 1) - mean(first, 1)) / 2**20, 1),
                     "rss_mb_second_min": round(mean(second, 1) / 2**20, 1) if second else None,
                     "rss_mb_change_from_second_min":
                         round((mean(last, 1) - mean(second, 1)) / 2**20, 1) if second else None,
                     "rss_mb_peak": round(max(r[1] for r in rows) / 2**20, 1),
                     "fds_first_min": round(mean(first, 2), 1), "fds_last_min": round(mean(last, 2), 1)}
    return out


def census_change(directory: Path) -> dict[str, Any]:
    """Per stage: what grew between its first and its last census."""
    by_stage: dict[str, list[dict]] = {}
    for path in sorted(directory.glob("*.json"), key=lambda p: int(p.stem.rsplit("-", 1)[1])):
        by_stage.setdefault(path.stem.rsplit("-", 1)[0], []).append(json.loads(path.read_text()))  # name-pid
    out = {}
    for stage, censuses in ((s, c) for s, c in by_stage.items() if len(c) >= 2):
        first, last = censuses[0], censuses[-1]
        types_first, types_last = dict(first["top_types"]), dict(last["top_types"])
        grown = sorted(((t, n - types_first.get(t, 0)) for t, n in types_last.items()), key=lambda x: -x[1])[:8]
        heap = lambda c, k: (c["heap"] or {}).get(k, 0) / 2**20  # noqa: E731
        tensors = lambda c, k: (c["tensors"] or {}).get(k, 0)  # noqa: E731
        out[stage] = {"rss_mb": [round(first["rss_bytes"] / 2**20, 1), round(last["rss_bytes"] / 2**20, 1)],
                      "rss_mb_after_trim": [round((c["rss_after_trim_bytes"] or 0) / 2**20, 1) for c in (first, last)],
                      "gc_objects": [first["gc_objects"], last["gc_objects"]],
                      "heap_in_use_mb": [round(heap(first, "in_use_bytes"), 1), round(heap(last, "in_use_bytes"), 1)],
                      "heap_from_os_mb": [round(heap(first, "from_os_bytes"), 1), round(heap(last, "from_os_bytes"), 1)],
                      "tensors": [tensors(first, "count"), tensors(last, "count")],
                      "tensor_mb": [round(tensors(c, "storage_bytes") / 2**20, 1) for c in (first, last)],
                      "types_grown": grown,
                      # every census in order: a plateau (warm-up caches) or a steady climb (a leak)
                      "series": [{"t": round(c["time"] - first["time"], 1), "rss_mb": round(c["rss_bytes"] / 2**20, 1),
                                  "rss_mb_after_trim": round((c["rss_after_trim_bytes"] or 0) / 2**20, 1),
                                  "gc_objects": c["gc_objects"], "heap_in_use_mb": round(heap(c, "in_use_bytes"), 1),
                                  "tensors": tensors(c, "count")} for c in censuses]}
    return out


async def soak(url: str, args, pids: dict[str, int], census_dir: Path | None) -> dict[str, Any]:
    import aiohttp

    kinds = [k for k in args.mix.split(",") if k]
    counts = {k: {"ok": 0, "failed": 0, "errors": []} for k in kinds}
    samples: list[dict] = []
    t0 = time.monotonic()
    end = t0 + args.duration

    rounds = [0]
    censusing: list[asyncio.Task] = []

    async def sample() -> None:
        next_census = args.census_at
        while time.monotonic() < end:
            procs = {name: f for name, pid in pids.items() if (f := process_figures(pid)) is not None}
            samples.append({"t": round(time.monotonic() - t0, 1), "procs": procs})
            if census_dir is not None and next_census is not None and time.monotonic() - t0 >= next_census:
                if not censusing or censusing[-1].done():  # one round at a time
                    rounds[0] += 1
                    censusing.append(asyncio.create_task(census_round(pids, census_dir, rounds[0])))
                next_census = next_census + args.census_every if args.census_every else None
            await asyncio.sleep(args.sample_s)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=180)) as http:
        model = args.served_model or await detect_model(url, None)
        traffic = Traffic(http, url, model, args.tokens)

        async def client(c: int) -> None:
            i = c
            while time.monotonic() < end:
                kind = kinds[i % len(kinds)]
                error = await traffic.run(kind, i)
                counts[kind]["ok" if error is None else "failed"] += 1
                if error and len(counts[kind]["errors"]) < 3:
                    counts[kind]["errors"].append(error)
                i += args.clients

        await asyncio.gather(sample(), *(client(c) for c in range(args.clients)))
    if census_dir is not None:
        if censusing:
            await censusing[-1]
        rounds[0] += 1
        await census_round(pids, census_dir, rounds[0])
    return {"requests": counts, "samples": samples, "processes": minute_figures(samples, time.monotonic() - t0),
            "census": census_change(census_dir) if census_dir is not None else None}


async def census_round(pids: dict[str, int], directory: Path, n: int, timeout_s: float = 25.0) -> list[str]:
    """Census `n` of every process, one process at a time: each census walks all the objects of its
    process on its event loop, and all of them at once on a small machine kept stages busy past the
    kernel's 30 s heartbeat timeout (the supervisor killed every stage). Returns the processes that
    wrote nothing within `timeout_s` (gone, or not censused)."""
    missing = []
    for name, pid in pids.items():
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            missing.append(name)
            continue
        deadline = time.monotonic() + timeout_s
        while not list(directory.glob(f"*-{pid}-{n}.json")) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        if not list(directory.glob(f"*-{pid}-{n}.json")):
            missing.append(name)
    if missing:
        say(f"census {n}: nothing from {', '.join(missing)}")
    return missing


def table(report: dict[str, Any]) -> str:
    lines = ["| process | RSS first min (MB) | RSS last min (MB) | change | 2nd min | change from 2nd | peak "
             "| fds first | fds last |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, f in report["processes"].items():
        second, from_second = f.get("rss_mb_second_min"), f.get("rss_mb_change_from_second_min")
        lines.append(f"| {name} | {f['rss_mb_first_min']} | {f['rss_mb_last_min']} | {f['rss_mb_change']:+} | "
                     f"{'-' if second is None else second} | {'-' if from_second is None else f'{from_second:+}'} | "
                     f"{f['rss_mb_peak']} | {f['fds_first_min']:.0f} | {f['fds_last_min']:.0f} |")
    done = ", ".join(f"{k} {v['ok']}/{v['ok'] + v['failed']}" for k, v in report["requests"].items())
    restarted = {k: v for k, v in (report.get("stage_restarts") or {}).items() if v}
    restarts = (f"\nstage restarts: {restarted} (their rows stop at the death)" if restarted
                else "\nstage restarts: none")
    return "\n".join(lines) + f"\n\nrequests ok/sent: {done}" + restarts


def start_omnid(args, census_dir: Path | None) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    cmd = [sys.executable, "-m", "omni.api.cli", "serve", "--port", str(port), "--mode", "process"]
    cmd += ["--model", args.model] if args.model else []
    log_path = Path(tempfile.mkdtemp(prefix="omni-soak-")) / "omnid.log"
    extra = {"OMNI_CENSUS_DIR": str(census_dir)} if census_dir is not None else {}
    say(f"omnid: {' '.join(cmd)} (log {log_path})")
    proc = subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=ROOT, env=child_env(extra))
    url, t0 = f"http://127.0.0.1:{port}", time.monotonic()
    while not health_ok(url):
        if proc.poll() is not None or time.monotonic() - t0 > args.start_timeout:
            kill_group(proc, 10)
            raise SystemExit(f"omnid did not come up: {last_line(log_path)}")
        time.sleep(1.0)
    return proc, url, log_path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    p.add_argument("--clients", type=int, default=4, help="closed-loop clients")
    p.add_argument("--mix", default=",".join(KINDS), help=f"request kinds, cycled: {', '.join(KINDS)}")
    p.add_argument("--tokens", type=int, default=16, help="text tokens (and audio frames) per answer")
    p.add_argument("--sample-s", type=float, default=5.0, help="seconds between RSS / fd samples")
    p.add_argument("--census", action="store_true", help="heap / tensor census of every stage (omni/census.py)")
    p.add_argument("--census-at", type=float, default=MINUTE, help="seconds into the soak of the first census")
    p.add_argument("--census-every", type=float, default=0.0,
                   help="seconds between further censuses (0: only the first and the last)")
    p.add_argument("--model", default=None, help="checkpoint dir (default: omnid's embedded tiny model)")
    p.add_argument("--url", default=None, help="soak a running server (its stage PIDs from /metrics)")
    p.add_argument("--served-model", default=None, help="model name to request (default: the first listed)")
    p.add_argument("--start-timeout", type=float, default=900.0)
    p.add_argument("--out", default=None, help="JSON report path")
    return p


def run(argv: list[str] | None = None) -> dict[str, Any]:
    import urllib.request

    args = build_parser().parse_args(argv)
    census_dir = Path(tempfile.mkdtemp(prefix="omni-census-")) if args.census else None
    proc = None
    try:
        if args.url:
            url = args.url.rstrip("/")
        else:
            proc, url, _ = start_omnid(args, census_dir)
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            pids = stage_pids(resp.read().decode())
        if proc is not None:
            pids["omnid"] = proc.pid
        say(f"soaking {url} for {args.duration:.0f} s with {args.clients} clients: {args.mix}; processes {pids}")
        report = asyncio.run(soak(url, args, pids, census_dir))
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            after = resp.read().decode()
        # a stage restarted during the soak is another process: its figures stop at its death
        report["stage_restarts"] = stage_restarts(after)
        report["stage_pids_changed"] = sorted(n for n, pid in stage_pids(after).items() if pids.get(n) != pid)
    finally:
        if proc is not None:
            say(f"omnid: {kill_group(proc, 30)}")
    report = {"command": " ".join([sys.executable, *sys.argv]), "date": now_iso(), "client": machine(),
              "duration_s": args.duration, "clients": args.clients, "mix": args.mix, **report}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    print(table(report))
    if report["census"]:
        print(json.dumps(report["census"], indent=1))
    return report


if __name__ == "__main__":
    run()
