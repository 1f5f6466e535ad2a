"""Experts hit per layer per decode step, for the token streams each engine produced.

How it is measured (the same for every engine, so SGLang needs no hook of its own): each
request's prompt + output tokens are replayed through the checkpoint's weights on torch (omni's
`Qwen3OmniThinker` from the same Qwen3-MoE directory, eager prefill, bf16 on the GPU); a wrapper
on every MoE layer's router records the top-k expert ids of every position. Then for instants
sampled evenly over each level, the requests decoding at that instant (from the token times the
driver recorded) form the step's batch, and the distinct experts their current tokens chose at a
layer are that step's experts hit at that layer (equal_work_support.hits_per_step). A replay in
bf16 can break a near-tie in the router differently from the engine's own kernels; the count of
distinct experts hardly moves with that.

Run:  python bench/expert_hits.py --model-path DIR --tokens omni_tokens.json [sglang_tokens.json ...]
          [--device cuda] [--out experts.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from equal_work_support import distinct_prompt, hits_per_step, stream_stats  # noqa: E402
from report import now_iso, say  # noqa: E402


class RouterTap:
    """Records, per engine step, the batch's spans and every MoE layer's top-k expert ids."""

    def __init__(self, model) -> None:
        from omni.layers.moe import SparseMoE

        self.steps: list[tuple[list, dict[int, Any]]] = []
        self._layers: dict[int, Any] = {}
        self._spans: list = []
        for i, layer in enumerate(model.model.layers):
            if isinstance(layer.mlp, SparseMoE):
                layer.mlp.route = self._wrap(layer.mlp.route, i)
        forward = model.forward

        def tapped(batch):
            self._spans = [(s.seq.rid, s.start, s.end, s.row) for s in batch.spans]
            self._layers = {}
            out = forward(batch)
            self.steps.append((self._spans, self._layers))
            return out

        model.forward = tapped

    def _wrap(self, route, layer: int):
        def wrapped(x):
            weights, chosen = route(x)
            self._layers[layer] = chosen
            return weights, chosen

        return wrapped

    def per_request(self) -> dict[str, np.ndarray]:
        """rid -> [positions, MoE layers, k] expert ids, positions in order."""
        parts: dict[str, list[tuple[int, np.ndarray]]] = {}
        for spans, layers in self.steps:
            order = sorted(layers)
            stacked = np.stack([layers[i].detach().to("cpu").numpy().astype(np.int16) for i in order], axis=1)
            for rid, start, end, row in spans:
                parts.setdefault(rid, []).append((start, stacked[row: row + end - start]))
        return {rid: np.concatenate([a for _, a in sorted(p, key=lambda t: t[0])]) for rid, p in parts.items()}


def replay(model, sequences: dict[str, list[int]], device: str, chunk_tokens: int = 8192) -> dict[str, np.ndarray]:
    """Router choices at every position of every sequence (an eager prefill of each, batched)."""
    from omni.stages.ar.config import EngineConfig
    from omni.stages.ar.engine import AREngine
    from omni.stages.ar.sequence import SamplingParams

    tap = RouterTap(model)
    longest = max(len(s) for s in sequences.values())
    per_seq = -(-(longest + 16) // 16)
    seqs = max(1, min(len(sequences), chunk_tokens // max(longest, 1)))
    cfg = EngineConfig(block_size=16, num_blocks=seqs * per_seq + 8, max_num_seqs=seqs, max_model_len=per_seq * 16,
                       max_num_batched_tokens=max(chunk_tokens, longest), device=device)
    engine = AREngine(model, cfg)
    for rid, ids in sequences.items():
        engine.add_request(rid, ids, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    while engine.has_unfinished():
        if not engine.step():
            break
    out = tap.per_request()
    return {rid: out[rid][: len(ids)] for rid, ids in sequences.items() if rid in out}


def measure(model, records: list[dict[str, Any]], device: str, samples: int = 64) -> list[dict[str, Any]]:
    """One row per (engine, level): experts hit per layer per decode step, and the streams' variety."""
    text = model.cfg.text
    seqs: dict[str, list[int]] = {}
    for e, rec in enumerate(records):
        for k, lv in enumerate(rec["levels"]):
            for r in lv["requests"]:
                if len(r.get("output_ids") or ()) >= 2:
                    prompt = distinct_prompt(r["index"], rec["prompt_len"], rec["seed"], text.vocab_size)
                    seqs[f"{e}:{k}:{r['index']}"] = prompt + list(r["output_ids"][:-1])
    t = time.perf_counter()
    topk = replay(model, seqs, device) if seqs else {}
    say(f"replayed {len(seqs)} sequences ({sum(map(len, seqs.values()))} tokens) in {time.perf_counter() - t:.1f}s")
    rows = []
    for e, rec in enumerate(records):
        for k, lv in enumerate(rec["levels"]):
            mine = {int(rid.rsplit(":", 1)[1]): a for rid, a in topk.items() if rid.startswith(f"{e}:{k}:")}
            hits = hits_per_step(lv, mine, rec["prompt_len"], text.num_experts, samples) if mine else None
            rows.append({"engine": rec["engine"], "phase": lv.get("phase"), "concurrency": lv["concurrency"],
                         **(hits or {}), "streams": stream_stats(lv)})
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--tokens", nargs="+", required=True, help="token records (omni_engine_load / sglang_engine_load)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--samples", type=int, default=64, help="instants sampled per level")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch

    from omni.models.qwen3_omni.checkpoint.text_checkpoint import load_text_thinker

    records = []
    for path in args.tokens:
        try:
            records.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as exc:
            say(f"skipping {path}: {exc}")
    model = load_text_thinker(args.model_path, args.device, torch.bfloat16)
    with torch.inference_mode():
        rows = measure(model, records, args.device, args.samples)
    for r in rows:
        say(json.dumps({k: v for k, v in r.items() if k != "hits_by_layer"}))
    report = {"date": now_iso(), "method": "post-hoc replay of each request's prompt + output tokens through the "
              "checkpoint's routers (omni's Qwen3OmniThinker, eager bf16, torch); decode batches read off the "
              "token times at instants sampled evenly over each level", "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
