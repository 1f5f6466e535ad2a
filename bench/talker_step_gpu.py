"""Per-frame cost of the talker's code predictor and of code2wav at full size on one GPU.

Random bf16 weights at the published sizes (`presets_full`; code predictor 5 layers, hidden
1024, 16 heads / 8 KV, 16 code groups; code2wav 216M params), drawn on the device. Measured:
  - code predictor, one talker frame for a batch of B rows (G-1 = 15 sequential steps) at the
    server's default sampling (every row samples: top-k 50, top-p 0.8, seeded hashed noise):
    eager `predict` with `sampled_codes` vs the CUDA-graph path (`CodePredictorGraphs`: one
    replay per frame, sampling inside); codes copied to the host each frame, as the talker does. Also: graph capture time, and whether both give the same
    codes (bf16: kernels may differ, so this is informative only);
  - code2wav, one 12-frame chunk for B streams past their first chunk (`decode_frames` + the
    PCM copy to the host, as the vocoder stage does), and one 4-frame first chunk; RTF = chunk
    time / the chunk's 0.96 s of audio (per stream, all B decoded together).
A frame is 80 ms of audio; at RTF 0.10 a talker step for all B requests has 8 ms.

Run:  python bench/talker_step_gpu.py [--batch 1,16] [--frames 40] [--chunks 8] [--out F.json]
      python bench/talker_step_gpu.py --scaled --device cpu   # dry run at test sizes
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

from omni.stages.codec_lm.code_predictor import CodePredictor, sampled_codes  # noqa: E402
from omni.stages.codec_lm.code_predictor_graphs import CodePredictorGraphs  # noqa: E402
from omni.models.qwen3_omni.config import load_config  # noqa: E402
from omni.models.qwen3_omni.checkpoint.presets_full import full_config, scaled_config  # noqa: E402
from omni.layers.random_init import randomize_  # noqa: E402
from omni.models.qwen3_omni.checkpoint.random_load import random_code2wav  # noqa: E402
from omni.layers.rotary import rope_inv_freq  # noqa: E402
from report import machine, now_iso, say  # noqa: E402

FRAME_S = 0.08  # 12.5 frames per second of audio


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, n: int, device: str) -> float:
    """Mean wall seconds of `fn()` over n calls (each call ends with a host copy, so it syncs)."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / n


def build_predictor(cfg, device: str, dtype) -> CodePredictor:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = CodePredictor(cfg.talker.code_predictor, cfg.talker.num_code_groups)
    finally:
        torch.set_default_dtype(previous)
    randomize_(model, device, seed=1)
    spec = cfg.talker.code_predictor
    model.inv_freq = rope_inv_freq(spec.head_dim, spec.rope_theta).to(device)
    return model


def predictor_rows(model: CodePredictor, batches: list[int], frames: int, warmup: int, device: str) -> list[dict]:
    graphs = CodePredictorGraphs(model, max(batches), device)
    hidden_size, vocab = model.spec.hidden_size, model.spec.vocab_size
    rows = []
    for b in batches:
        gen = torch.Generator(device=device).manual_seed(b)
        dtype = model.lm_head[0].weight.dtype
        hidden = torch.randn(b, hidden_size, generator=gen, device=device).to(dtype)
        code0 = torch.randint(0, vocab, (b,), generator=gen, device=device)
        embed = model.model.codec_embedding[0](code0)
        temperature = torch.ones(b, device=device)  # sampling rows, as the talker's default
        seed = torch.arange(b, device=device) + 7
        frame = torch.zeros(b, dtype=torch.long, device=device)
        sample = sampled_codes(temperature, seed, frame, model.num_code_groups)

        def eager():
            return model.predict(hidden, embed, sample)[0].cpu()

        def graph():
            return graphs.run(hidden, embed, temperature, seed, frame)[0].cpu()

        sync(device)
        t0 = time.perf_counter()
        graph()  # first call for this bucket: capture
        capture_s = time.perf_counter() - t0
        for _ in range(warmup):
            eager(), graph()
        eager_s, graph_s = timed(eager, frames, device), timed(graph, frames, device)
        same = float((eager() == graph()).float().mean())
        rows.append({"part": "code_predictor", "batch": b, "eager_ms": round(1e3 * eager_s, 3),
                     "graph_ms": round(1e3 * graph_s, 3), "speedup": round(eager_s / graph_s, 2),
                     "capture_s": round(capture_s, 3), "codes_equal_fraction": round(same, 4),
                     "graphs_disabled": graphs.disabled})
        say(json.dumps(rows[-1]))
    return rows


def code2wav_rows(model, batches: list[int], chunks: int, warmup: int, device: str) -> list[dict]:
    rows = []
    groups, codebook = model.num_groups, model.codebook_size
    for b in batches:
        gen = torch.Generator(device=device).manual_seed(100 + b)

        def codes(frames: int) -> torch.Tensor:
            return torch.randint(0, codebook, (b, frames, groups), generator=gen, device=device)

        streams = [model.new_stream() for _ in range(b)]
        first = codes(4)
        model.decode_frames(first, [model.new_stream() for _ in range(b)]).cpu()  # lazy inits
        first_s = timed(lambda: model.decode_frames(first, [model.new_stream() for _ in range(b)]).cpu(), 2, device)
        model.decode_frames(first, streams).cpu()  # past the start-up chunk: the steady batch key
        chunk = codes(12)
        for _ in range(warmup):
            model.decode_frames(chunk, streams).cpu()
        chunk_s = timed(lambda: model.decode_frames(chunk, streams).cpu(), chunks, device)
        rows.append({"part": "code2wav", "batch": b, "first_chunk_4_ms": round(1e3 * first_s, 2),
                     "chunk_12_ms": round(1e3 * chunk_s, 2), "per_frame_ms": round(1e3 * chunk_s / 12, 3),
                     "rtf": round(chunk_s / (12 * FRAME_S), 4)})  # each of the b streams, decoded together
        say(json.dumps(rows[-1]))
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| part | batch | eager ms/frame | graph ms/frame | speedup | capture s | code2wav 12-frame chunk ms "
             "| code2wav first 4-frame chunk ms | code2wav RTF |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['part']} | {r['batch']} | {r.get('eager_ms', '–')} | {r.get('graph_ms', '–')} "
                     f"| {r.get('speedup', '–')} | {r.get('capture_s', '–')} | {r.get('chunk_12_ms', '–')} "
                     f"| {r.get('first_chunk_4_ms', '–')} | {r.get('rtf', '–')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--frames", type=int, default=40, help="timed code-predictor frames per batch size")
    ap.add_argument("--chunks", type=int, default=8, help="timed code2wav chunks per batch size")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--scaled", action="store_true", help="test sizes (a dry run)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    batches = [int(x) for x in args.batch.split(",")]
    tmp = Path("/tmp/omni-talker-step")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(scaled_config() if args.scaled else full_config()))
    cfg = load_config(tmp)
    t0 = time.perf_counter()
    predictor = build_predictor(cfg, args.device, torch.bfloat16)
    code2wav = random_code2wav(cfg.code2wav, device=args.device, dtype=torch.bfloat16, seed=2)
    sync(args.device)
    say(f"code predictor {sum(p.numel() for p in predictor.parameters()) / 1e6:.0f}M params, code2wav "
        f"{sum(p.numel() for p in code2wav.parameters()) / 1e6:.0f}M, random bf16 in {time.perf_counter() - t0:.1f}s")
    with torch.inference_mode():
        rows = predictor_rows(predictor, batches, args.frames, args.warmup, args.device)
        rows += code2wav_rows(code2wav, batches, args.chunks, args.warmup, args.device)
    budget = {}
    for b in batches:
        cp = next(r for r in rows if r["part"] == "code_predictor" and r["batch"] == b)
        cw = next(r for r in rows if r["part"] == "code2wav" and r["batch"] == b)
        budget[b] = {"graph_plus_code2wav_ms_per_frame": round(cp["graph_ms"] + cw["per_frame_ms"], 3),
                     "rtf_0.10_budget_ms": round(0.1 * FRAME_S * 1e3, 1)}
    report = {"command": " ".join(["python", "bench/talker_step_gpu.py", *(argv if argv is not None else sys.argv[1:])]),
              "date": now_iso(), "machine": machine(), "scaled": args.scaled,
              "tf32": torch.backends.cuda.matmul.allow_tf32, "rows": rows, "per_frame_budget": budget}
    print(table(rows))
    print(json.dumps({"per_frame_budget (talker MoE step not included)": budget}))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
