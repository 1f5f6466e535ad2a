"""The transformers baseline: bench/serve.py's workload through `Qwen3OmniMoeForConditionalGeneration.generate`.

Same prompt sets (serve.PROMPT_SETS, chat template, one user turn), greedy, fixed lengths:
`thinker_max_new_tokens` = `thinker_min_new_tokens` = --max-tokens (EOS cannot end it early), and
`talker_max_new_tokens` = `talker_min_new_tokens` = --audio-tokens. transformers serves one request
at a time and returns audio only at the end, so per request: TTFT and TPOT from a streamer on the
thinker's generate, time to first audio = the whole request, RTF = latency / audio seconds.

Concurrency levels are a closed-loop queue in front of that one worker: each request's service
times are measured (sequentially, after a warm-up), and a level with c clients is the FIFO
schedule of those same service times (request j + c is sent when request j ends). Throughput is
therefore the same at every level; latency grows with the queue. The report says so
(`config.simulated_queue`). Same JSON / markdown / PNG as bench/serve.py.

Run:  python bench/hf_baseline.py --model DIR            (a Qwen3-Omni checkpoint, e.g. a tiny one)
      python bench/hf_baseline.py --random-full          (Qwen3-Omni-30B-A3B sizes, random bf16 on the GPU)
          [--device cuda] [--concurrency 1,4,16] [--requests N] [--prompt-set short] [--max-tokens 32]
          [--audio-tokens 64] [--out bench/results/hf.json] [--plot hf.png] [--md hf.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from serve import PROMPT_SETS  # noqa: E402
from serve_report import level_summary, machine, now_iso, say, write_report  # noqa: E402


class _Clock:
    """A generate streamer: the first `put` is the prompt, every later one a new token."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.seen_prompt = False

    def put(self, value) -> None:
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def load_random_full(device: str):
    """The full-size model with random bf16 weights, built directly on `device` (no checkpoint)."""
    import torch
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration
    from transformers.utils import logging as hf_logging

    from omni.models.qwen3_omni.checkpoint.presets_full import full_config
    from omni.layers.tokenizer_offline_full import build_tokenizer

    hf_logging.set_verbosity_error()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen3OmniMoeForConditionalGeneration(Qwen3OmniMoeConfig(**full_config()))
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():  # transformers leaves the talker's routed experts as torch.empty
        gen = torch.Generator(device=device).manual_seed(0)
        for name, param in sorted(model.named_parameters()):
            talker_expert = name.startswith("talker.") and ".mlp.experts." in name
            if talker_expert or (param.is_floating_point() and not torch.isfinite(param).all()):
                param.normal_(0.0, 0.02, generator=gen)
    return model.eval(), build_tokenizer()


def load_checkpoint(model_dir: str, device: str):
    import torch
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def serve_one(model, tokenizer, prompt: str, args, device: str) -> dict[str, Any]:
    import torch

    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"].to(device)
    clock = _Clock()
    audio = "audio" in args.modalities
    kwargs = dict(thinker_max_new_tokens=args.max_tokens, thinker_min_new_tokens=args.max_tokens,
                  thinker_do_sample=False, thinker_streamer=clock, return_audio=audio,
                  thinker_eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))
    if audio:
        kwargs.update(speaker=args.voice, talker_max_new_tokens=args.audio_tokens,
                      talker_min_new_tokens=args.audio_tokens, talker_do_sample=False)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, **kwargs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    latency = time.perf_counter() - t0
    text_ids, wav = (out if isinstance(out, tuple) else (out, None))
    n = int(text_ids.shape[-1] - ids.shape[-1])
    row = {"ok": True, "error": None, "latency_s": latency, "output_tokens": n,
           "ttft_s": clock.times[0] - t0 if clock.times else None,
           "tpot_s": (clock.times[-1] - clock.times[0]) / (len(clock.times) - 1) if len(clock.times) > 1 else None,
           "ttfa_s": None, "audio_s": None}
    if audio and wav is not None:
        row["audio_s"] = int(wav.reshape(-1).shape[0]) / 24000
        row["ttfa_s"] = latency  # the waveform comes back whole, at the end
    return row


def queue_level(service: list[dict], concurrency: int, n: int) -> tuple[list[dict], float]:
    """c closed-loop clients in front of one FIFO worker with these service times."""
    free, finish, rows = 0.0, [], []
    for j in range(n):
        s = service[j % len(service)]
        sent = 0.0 if j < concurrency else finish[j - concurrency]
        start = max(sent, free)
        free = start + s["latency_s"]
        finish.append(free)
        wait = start - sent
        row = dict(s, index=j, latency_s=free - sent)
        for key in ("ttft_s", "ttfa_s"):
            if s.get(key) is not None:
                row[key] = s[key] + wait
        rows.append(row)
    return rows, finish[-1]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a Qwen3-Omni checkpoint directory")
    src.add_argument("--random-full", action="store_true", help="full-size random bf16 weights on --device")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--concurrency", default="1,4,16,32,64")
    ap.add_argument("--requests", type=int, default=None, help="requests per level (default max(2c, 8))")
    ap.add_argument("--service-requests", type=int, default=4, help="requests actually run (then queued)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--prompt-set", choices=sorted(PROMPT_SETS), default="short")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--audio-tokens", type=int, default=64)
    ap.add_argument("--modalities", default="text,audio")
    ap.add_argument("--voice", default="ethan")
    ap.add_argument("--label", default="transformers")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--md", default=None)
    args = ap.parse_args(argv)
    args.modalities = [m.strip() for m in args.modalities.split(",") if m.strip()]
    t0 = time.perf_counter()
    model, tokenizer = load_random_full(args.device) if args.random_full else load_checkpoint(args.model, args.device)
    load_s = time.perf_counter() - t0
    prompts = PROMPT_SETS[args.prompt_set]
    say(f"transformers model ready in {load_s:.1f}s; warm-up {args.warmup}")
    for i in range(args.warmup):
        serve_one(model, tokenizer, prompts[i % len(prompts)], args, args.device)
    service = []
    for i in range(args.service_requests):
        row = serve_one(model, tokenizer, prompts[i % len(prompts)], args, args.device)
        say(f"request {i}: {row['latency_s']:.2f}s, {row['output_tokens']} tokens, audio {row['audio_s']}s")
        service.append(row)
    levels = []
    for c in (int(x) for x in args.concurrency.split(",")):
        rows, wall = queue_level(service, c, args.requests or max(2 * c, 8))
        levels.append(level_summary(rows, wall, c))
    report = {
        "label": args.label,
        "command": " ".join(["python", "bench/hf_baseline.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": now_iso(),
        "machine": machine(),
        "server": f"transformers generate in-process on {args.device} (load {load_s:.1f}s)",
        "config": {"model": args.model or "qwen3-omni-30b-a3b random bf16", "prompt_set": args.prompt_set,
                   "max_tokens": args.max_tokens, "audio_tokens": args.audio_tokens if "audio" in args.modalities
                   else None, "modalities": args.modalities, "ignore_eos": True, "temperature": 0.0,
                   "simulated_queue": True, "service_requests": args.service_requests},
        "service_rows": service,
        "levels": levels,
    }
    return write_report(report, args.out, args.md, args.plot)


if __name__ == "__main__":
    main()
