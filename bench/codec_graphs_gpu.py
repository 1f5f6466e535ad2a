"""The streaming codec decoders' chunk cost on one GPU, eager vs CUDA graphs (issue 23).

Both families' decoders at their published sizes with random bf16 weights drawn on the device:
Qwen3-TTS's 12 Hz speech tokenizer decoder (`make-tiny qwen3-tts --preset full-1.7b`'s sizes) and
Qwen3-Omni's code2wav (`presets_full`). Per (batch, chunk frames): ms a chunk for B streams past
their first chunk (the decoder's `decode_frames` + the PCM copy to the host, as the vocoder stage
does it), eagerly (the slots, no graphs) and from the captured graph; and what that chunk cost
allows: audio seconds decoded per second (B * frames * 80 ms / chunk time). Plus capture time.

Run:  python bench/codec_graphs_gpu.py [--codecs tts,omni] [--batch 1,16,64,128] [--frames 1,4,12] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import torch  # noqa: E402

from report import machine, now_iso, say  # noqa: E402

FRAME_S = 0.08


def tts_decoder(device: str):
    from omni.models.qwen3_tts.checkpoint.tiny_tokenizer import init_decoder_, tokenizer_config
    from omni.models.qwen3_tts.modules.speech_tokenizer import parse_tokenizer_config
    from omni.models.qwen3_tts.modules.speech_tokenizer_decoder import SpeechTokenizerDecoder

    cfg = parse_tokenizer_config(tokenizer_config("full-1.7b", num_quantizers=16, codebook_size=2048)).decoder
    with torch.device(device):
        model = SpeechTokenizerDecoder(cfg)
    init_decoder_(model, 0)
    return model.to(dtype=torch.bfloat16).eval()


def omni_code2wav(device: str):
    from omni.models.qwen3_omni.checkpoint.presets_full import full_config
    from omni.models.qwen3_omni.checkpoint.random_load import random_code2wav
    from omni.models.qwen3_omni.config import load_config

    tmp = Path("/tmp/omni-codec-bench")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(full_config()))
    return random_code2wav(load_config(tmp).code2wav, device=device, dtype=torch.bfloat16, seed=2).eval()


def timed(fn, n: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def rows_for(name: str, model, batches: list[int], frames: list[int], reps: int, device: str) -> list[dict]:
    rows = []
    g = model.num_groups
    for graphs in (False, True):
        if graphs:
            t0 = time.perf_counter()
            n = model.capture_graphs(frames[0], max(frames), max(batches))
            say(f"{name}: {n} graphs captured in {time.perf_counter() - t0:.1f}s")
        for b in batches:
            streams = [model.new_stream() for _ in range(b)]
            first = torch.zeros(b, frames[0], g, dtype=torch.long, device=device)
            model.decode_frames(first, streams).cpu()  # past the first chunk: the steady shapes
            for t in frames:
                codes = torch.randint(0, model.codebook_size, (b, t, g), device=device)
                model.decode_frames(codes, streams).cpu()
                ms = 1e3 * timed(lambda: model.decode_frames(codes, streams).cpu(), reps)
                rows.append({"codec": name, "graphs": graphs, "batch": b, "frames": t, "ms_per_chunk": round(ms, 3),
                             "audio_s_per_s": round(b * t * FRAME_S / (ms / 1e3), 1)})
                say(f"{name} graphs={graphs} B={b} T={t}: {ms:.2f} ms a chunk, "
                    f"{rows[-1]['audio_s_per_s']} audio s/s")
            for s in streams:
                model.release(s)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| codec | batch | frames | eager ms | graph ms | speedup | graph audio s/s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["graphs"]:
            continue
        g = next(x for x in rows if x["graphs"] and x["codec"] == r["codec"] and x["batch"] == r["batch"]
                 and x["frames"] == r["frames"])
        lines.append(f"| {r['codec']} | {r['batch']} | {r['frames']} | {r['ms_per_chunk']} | {g['ms_per_chunk']} | "
                     f"{r['ms_per_chunk'] / g['ms_per_chunk']:.1f}x | {g['audio_s_per_s']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--codecs", default="tts,omni")
    ap.add_argument("--batch", default="1,16,64,128")
    ap.add_argument("--frames", default="1,4,12", help="chunk lengths; the first is also the first chunk")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    batches = [int(x) for x in args.batch.split(",")]
    frames = [int(x) for x in args.frames.split(",")]
    rows = []
    with torch.inference_mode():
        for name in args.codecs.split(","):
            model = tts_decoder(args.device) if name == "tts" else omni_code2wav(args.device)
            say(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params")
            rows += rows_for(name, model, batches, frames, args.reps, args.device)
            del model
            torch.cuda.empty_cache()
    report = {"command": " ".join(["python", "bench/codec_graphs_gpu.py", *(argv or sys.argv[1:])]),
              "date": now_iso(), "machine": machine(), "rows": rows, "markdown": markdown(rows)}
    print(report["markdown"])
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
