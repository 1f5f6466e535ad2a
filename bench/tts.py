"""Qwen3-TTS on one GPU: omnid over HTTP against the reference package's own `generate`, same GPU, same run.

For a named voice (a CustomVoice checkpoint, speaker "vivian") and a cloned one (a Base checkpoint,
a voice uploaded once through POST /v1/audio/voices), at the published 12Hz-1.7B sizes with random
bf16 weights (`make_tiny` preset `full-1.7b`, written here): per concurrency level (closed loop, c
clients) TTFA (first audio byte of a streamed /v1/audio/speech), RTF (a request's wall time over its
audio seconds) and audio seconds per second (all audio over the level's wall time). Every request
asks for the same number of frames (`stage_sampling.talker` {max_tokens, ignore_eos}); sampling is
the server's default (the checkpoint's generation_config: what users get).

Phases per voice kind: omnid fresh (its first request, and for the cloned voice the upload and the
first use, reported apart as "fresh"), then the warm levels; then omnid stops and the reference
runs on the same GPU: `Qwen3TTSModel.generate_custom_voice` / `generate_voice_clone` (with a voice
prompt made once by `create_voice_clone_prompt`), a batch of c texts per call (its own batching),
non-streaming, so its TTFA is its whole latency; it stops only at max_new_tokens (its eos id is set to
one it never samples), but a random talker may still sample codec EOS, which the reference then cuts
from that row: its rows count the audio it actually made.

Run:  python bench/tts.py --out-dir R [--kinds custom_voice,base] [--concurrency 1,8,16,64]
          [--frames 64] [--budget-s 480] [--reference-levels 1,8,16,64] [--no-reference] [--scaled]
`--scaled`: a CPU dry run at tiny sizes (preset tiny-a, levels 1,2). Writes R/tts.json and R/tts.md.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]

from report import machine, now_iso, say  # noqa: E402
from suite_support import child_env, free_port, health_ok, kill_group, last_line  # noqa: E402

PY = sys.executable
RATE, FRAME_SAMPLES = 24000, 1920
TEXTS = [
    "The quick brown fox jumps over the lazy dog near the quiet river bank.",
    "Please remember to bring your umbrella, the forecast says it will rain all afternoon.",
    "Our meeting moved to Thursday at ten, in the small room on the second floor.",
    "Thank you for calling, your order has shipped and should arrive within three days.",
]
REF_TEXT = "this is the reference clip, read aloud at an even pace"
VOICE = {"custom_voice": "vivian", "base": "bench-clone"}


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summary(engine: str, kind: str, phase: str, c: int, rows: list[dict], wall: float) -> dict[str, Any]:
    ok = [r for r in rows if r.get("ok")]
    ttfa = [r["ttfa_s"] * 1000 for r in ok]
    rtf = [r["wall_s"] / r["audio_s"] for r in ok if r["audio_s"] > 0]
    audio = sum(r["audio_s"] for r in ok)
    return {"engine": engine, "voice": "named" if kind == "custom_voice" else "cloned", "kind": kind, "phase": phase,
            "concurrency": c, "requests": len(rows), "ok": len(ok),
            "ttfa_ms_mean": statistics.fmean(ttfa) if ttfa else None, "ttfa_ms_p50": pct(ttfa, 0.5),
            "ttfa_ms_p90": pct(ttfa, 0.9), "rtf_mean": statistics.fmean(rtf) if rtf else None,
            "audio_s_per_s": audio / wall if wall > 0 else None, "audio_s": audio, "wall_s": wall,
            "errors": [r["error"] for r in rows if not r.get("ok")][:3],
            "ttfa_ms_each": [[r.get("i"), round(r["ttfa_s"] * 1000, 1)] for r in ok]}  # [text index, ms], by finish


# ---- omnid ----------------------------------------------------------------------------------
class Omnid:
    def __init__(self, model_dir: Path, out: Path, args) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        sets = []
        if not args.scaled:
            seqs = max(args.levels)
            sets = ["talker.args.cuda_graphs=true", f"talker.args.max_num_seqs={seqs}",
                    f"talker.args.cuda_graph_max_batch={seqs}", "talker.args.max_model_len=4096"]
        self.cmd = [PY, "-m", "omni.api.cli", "serve", "--model", str(model_dir), "--port", str(self.port),
                    "--mode", "process"] + (["--device", args.device, "--dtype", "bfloat16"] if not args.scaled else [])
        self.cmd += [x for s in sets + list(args.set) for x in ("--set", s)]
        self.log_path = out / f"omnid-{model_dir.name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, limit: float) -> float | None:
        say(f"omnid: {' '.join(self.cmd)}")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=ROOT, env=child_env())
        while time.monotonic() - t0 < limit:
            if self.proc.poll() is not None:
                say(f"omnid exited rc {self.proc.returncode}: {last_line(self.log_path)}")
                return None
            if health_ok(self.url):
                return time.monotonic() - t0
            time.sleep(1.0)
        say(f"omnid not healthy after {limit:.0f}s: {last_line(self.log_path)}")
        return None

    def stop(self) -> None:
        if self.proc is not None:
            say(f"omnid: {kill_group(self.proc, 20)}")


async def speak(session, url: str, model: str, voice: str, text: str, frames: int) -> dict[str, Any]:
    body = {"model": model, "input": text, "voice": voice, "response_format": "pcm",
            "stage_sampling": {"talker": {"max_tokens": frames + 1, "ignore_eos": True}}}
    t0 = time.monotonic()
    first, size = None, 0
    try:
        async with session.post(url + "/v1/audio/speech", json=body) as resp:
            if resp.status != 200:
                return {"ok": False, "error": f"{resp.status}: {(await resp.text())[:200]}"}
            async for chunk in resp.content.iter_any():
                if chunk and first is None:
                    first = time.monotonic() - t0
                size += len(chunk)
    except Exception as exc:  # a failed request is a row, not the end of the run
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    wall = time.monotonic() - t0
    return {"ok": size > 0, "ttfa_s": first or wall, "wall_s": wall, "audio_s": size / 2 / RATE,
            "error": None if size else "no audio", "t0": t0}


async def closed_loop(url: str, model: str, voice: str, c: int, n: int, frames: int, deadline: float) -> tuple[list, float]:
    import aiohttp

    rows: list[dict] = []
    todo = iter(range(n))

    async def client(session):
        for i in todo:
            if time.monotonic() > deadline:
                return
            rows.append({**await speak(session, url, model, voice, TEXTS[i % len(TEXTS)] + f" ({i})", frames), "i": i})

    t0 = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=max(60.0, deadline - t0 + 30))
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(client(session) for _ in range(c)))
    return rows, time.monotonic() - t0


def upload_voice(url: str, name: str, clip) -> tuple[float, str | None]:
    import urllib.request
    import uuid

    boundary = uuid.uuid4().hex
    parts = [(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n').encode()
             for k, v in (("name", name), ("ref_text", REF_TEXT))]
    parts.append((f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="clip.wav"\r\n'
                  "Content-Type: audio/wav\r\n\r\n").encode() + wav_bytes(clip) + b"\r\n")
    data = b"".join(parts) + f"--{boundary}--\r\n".encode()
    req = urllib.request.Request(url + "/v1/audio/voices", data=data,
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()
        return time.monotonic() - t0, None
    except Exception as exc:
        return time.monotonic() - t0, f"{type(exc).__name__}: {exc}"


def test_clip(seconds: float = 4.0):
    import numpy as np

    t = np.arange(int(RATE * seconds)) / RATE
    tone = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((150, 300, 450, 800), 1))
    noise = np.random.default_rng(0).standard_normal(len(t))
    return (0.3 * tone * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t)) + 0.01 * noise).astype(np.float32)


def wav_bytes(pcm) -> bytes:
    import wave

    import numpy as np

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def run_omni(kind: str, model_dir: Path, out: Path, args, deadline: float) -> list[dict]:
    rows: list[dict] = []
    server = Omnid(model_dir, out, args)
    started = server.start(min(180.0, deadline - time.monotonic() - 20))
    if started is None:
        server.stop()
        return [{"engine": "omni", "kind": kind, "phase": "start", "error": last_line(server.log_path)}]
    say(f"omni {kind}: healthy in {started:.1f}s")
    model, voice = model_dir.name, VOICE[kind]
    try:
        fresh = {"engine": "omni", "kind": kind, "phase": "fresh", "start_s": round(started, 1)}
        if kind == "base":
            fresh["voice_upload_s"], err = upload_voice(server.url, voice, test_clip())
            if err:
                fresh["error"] = err
                return [fresh]
        first, wall = asyncio.run(closed_loop(server.url, model, voice, 1, 1, args.frames, deadline))
        again, wall2 = asyncio.run(closed_loop(server.url, model, voice, 1, 1, args.frames, deadline))
        rows.append({**fresh, **summary("omni", kind, "fresh", 1, first, wall),
                     "second_request": summary("omni", kind, "fresh", 1, again, wall2)})
        say(f"omni {kind} fresh: {rows[-1]}")
        asyncio.run(closed_loop(server.url, model, voice, max(args.levels), max(args.levels), args.frames, deadline))
        for c in args.levels:
            if time.monotonic() > deadline - 20:
                say(f"omni {kind}: c={c} skipped (time)")
                rows.append({"engine": "omni", "kind": kind, "phase": f"c={c}", "error": "skipped: out of time"})
                continue
            n = max(2 * c, 4)
            level, wall = asyncio.run(closed_loop(server.url, model, voice, c, n, args.frames, deadline))
            rows.append(summary("omni", kind, "warm", c, level, wall))
            say(f"omni {kind} c={c}: {rows[-1]}")
    finally:
        server.stop()
    return rows


# ---- the reference --------------------------------------------------------------------------
def run_reference(kind: str, model_dir: Path, args, deadline: float) -> list[dict]:
    import torch

    import qwen3_tts_reference

    ref_pkg = qwen3_tts_reference.load()
    if ref_pkg is None:
        return [{"engine": "reference", "kind": kind, "phase": "load", "error": "qwen_tts not importable"}]
    t0 = time.monotonic()
    kw = {} if args.scaled else {"device_map": args.device, "dtype": torch.bfloat16}
    ref = ref_pkg.Qwen3TTSModel.from_pretrained(str(model_dir), **kw)
    load_s = time.monotonic() - t0
    cfg = json.loads((model_dir / "config.json").read_text())["talker_config"]
    # the codec pad id is never sampled (suppressed): no early stop, exactly `frames` frames as omni's requests
    gen = dict(max_new_tokens=args.frames + 1, eos_token_id=cfg["codec_pad_id"])
    prompt, make_s = None, None
    if kind == "base":
        t1 = time.monotonic()
        prompt = ref.create_voice_clone_prompt(ref_audio=(test_clip(), RATE), ref_text=REF_TEXT)
        make_s = time.monotonic() - t1
    rows = []

    def call(texts: list[str]) -> list:
        if kind == "base":
            return ref.generate_voice_clone(texts, voice_clone_prompt=prompt * len(texts), **gen)[0]
        return ref.generate_custom_voice(texts, speaker=VOICE[kind], **gen)[0]

    for c in args.reference_levels:
        if time.monotonic() > deadline - 30:
            say(f"reference {kind}: c={c} skipped (time)")
            rows.append({"engine": "reference", "kind": kind, "phase": f"c={c}", "error": "skipped: out of time"})
            continue
        texts = [TEXTS[i % len(TEXTS)] + f" ({i})" for i in range(c)]
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t1 = time.monotonic()
        try:
            wavs = call(texts)
        except Exception as exc:  # e.g. out of memory at a large batch: the row says so
            rows.append({"engine": "reference", "kind": kind, "phase": "warm", "concurrency": c,
                         "error": f"{type(exc).__name__}: {exc}"[:300]})
            break
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        wall = time.monotonic() - t1
        per = [{"ok": True, "ttfa_s": wall, "wall_s": wall, "audio_s": len(w) / RATE} for w in wavs]
        row = summary("reference", kind, "warm" if rows else "first", c, per, wall)
        row.update(load_s=round(load_s, 1), **({"voice_prompt_s": round(make_s, 3)} if make_s is not None else {}))
        rows.append(row)
        say(f"reference {kind} c={c}: {row}")
    del ref
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return rows


# ---- report ---------------------------------------------------------------------------------
def markdown(rows: list[dict]) -> str:
    def f(v, digits=1):
        return "" if v is None else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))

    lines = ["| engine | voice | phase | c | ok/n | TTFA mean ms | TTFA p50 | TTFA p90 | RTF | audio-s/s | notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = {"start_s": "server start {} s", "voice_upload_s": "voice upload {:.2f} s", "load_s": "load {} s",
             "voice_prompt_s": "voice prompt {:.2f} s"}
    for r in rows:
        if "concurrency" not in r:
            lines.append(f"| {r.get('engine')} | {r.get('kind')} | {r.get('phase')} | | | | | | | | "
                         f"error: {r.get('error')} |")
            continue
        for row, phase in ((r, r["phase"]), (r.get("second_request"), "fresh, 2nd request")):
            if row is None:
                continue
            note = ", ".join(t.format(row[k]) for k, t in notes.items() if row.get(k) is not None)
            errors = "; ".join(row.get("errors") or [])
            lines.append(f"| {row['engine']} | {row['voice']} | {phase} | {row['concurrency']} | "
                         f"{row['ok']}/{row['requests']} | {f(row['ttfa_ms_mean'])} | {f(row['ttfa_ms_p50'])} | "
                         f"{f(row['ttfa_ms_p90'])} | {f(row['rtf_mean'], 3)} | {f(row['audio_s_per_s'])} | "
                         f"{note}{'; ' if note and errors else ''}{errors[:120]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--kinds", default="custom_voice,base")
    ap.add_argument("--concurrency", default=None, help="omnid levels (default 1,8,16,64; scaled 1,2)")
    ap.add_argument("--reference-levels", default=None, help="reference batch sizes (default: the omnid levels)")
    ap.add_argument("--frames", type=int, default=None, help="audio frames per request (12.5 per second; default 64: 5.1 s)")
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--device", default=None)
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--scaled", action="store_true", help="CPU dry run at tiny sizes")
    ap.add_argument("--set", action="append", default=[], metavar="STAGE.FIELD=VALUE", help="extra omnid --set")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    args.device = args.device or ("cpu" if args.scaled else "cuda")
    args.levels = [int(x) for x in (args.concurrency or ("1,2" if args.scaled else "1,8,16,64")).split(",")]
    args.reference_levels = [int(x) for x in (args.reference_levels or ",".join(map(str, args.levels))).split(",")]
    args.frames = args.frames or (8 if args.scaled else 64)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from omni.models.qwen3_tts.checkpoint.make_tiny import make_tiny

    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    rows: list[dict] = []
    for i, kind in enumerate(kinds):
        share = (deadline - time.monotonic()) / (len(kinds) - i)
        kind_deadline = time.monotonic() + share
        t1 = time.monotonic()
        model_dir = make_tiny(out / f"qwen3-tts-{kind}", kind, "tiny-a" if args.scaled else "full-1.7b", seed=0,
                              device=args.device)
        say(f"{kind}: checkpoint in {time.monotonic() - t1:.1f}s")
        omni_deadline = kind_deadline if args.no_reference else time.monotonic() + 0.55 * (kind_deadline - time.monotonic())
        rows += run_omni(kind, model_dir, out, args, omni_deadline)
        if not args.no_reference:
            try:
                rows += run_reference(kind, model_dir, args, kind_deadline)
            except Exception as exc:  # the reference failing must not lose omni's rows
                rows.append({"engine": "reference", "kind": kind, "phase": "load",
                             "error": f"{type(exc).__name__}: {exc}"[:300]})
        (out / "tts.json").write_text(json.dumps({"when": now_iso(), "machine": machine(), "argv": sys.argv,
                                                  "frames": args.frames, "rows": rows}, indent=2))
    md = f"# Qwen3-TTS 12Hz-1.7B (random weights), {args.frames} frames per request\n\n" + markdown(rows)
    (out / "tts.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
