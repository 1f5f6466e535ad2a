"""Host-side cost of one AR engine decode step, by phase, with the model forward a no-op.

The model returns preallocated outputs of the right shapes, so what is timed is only the
engine's own Python and small tensor work: schedule, prepare (the step's inputs), fill (the
graph's static buffers, when graphs are on), forward (the no-op plus the graph runner's glue),
sample (logits, sampler, `after_sample`) and postprocess (the rest of `step`). On CPU, graphs on
(the default) run the padded fixed-shape path that CUDA graphs replay eagerly, exactly as
in the CPU tests. Also counts the aten ops dispatched per step (each one a kernel launch or an
H2D copy on a GPU).

Run:  python bench/engine_host_overhead.py [--batch 1,16,64] [--steps 200] [--no-graphs]
          [--device cpu|cuda] [--json out.json]
On CUDA the graphs are captured for real and the phases are host time (launches are async);
`total` includes the step's one sync (the sampled ids coming back).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from omni.stages.ar.config import EngineConfig  # noqa: E402
from omni.stages.ar.engine import AREngine  # noqa: E402
from omni.stages.ar.model_api import ARModel, DecodeForm, ForwardBatch, ForwardOutput, KVCacheSpec  # noqa: E402
from omni.stages.ar.sequence import SamplingParams  # noqa: E402

PHASES = ("schedule", "prepare", "fill", "forward", "sample", "postprocess")


class NoOpModel(ARModel):
    """Right shapes, no compute: thinker-like [3, n] float32 M-RoPE positions, ids input."""

    supports_cuda_graphs = True
    decode_form = DecodeForm(pos_lead=(3,), pos_dtype=torch.float32)

    def __init__(self, hidden: int = 64, vocab: int = 1024, max_tokens: int = 8192, device: str = "cpu") -> None:
        self.hidden = torch.zeros(max_tokens, hidden, device=device)
        self.table = torch.randn(max_tokens, vocab, generator=torch.Generator().manual_seed(0)).to(device)

    def kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(num_layers=2, num_kv_heads=1, head_dim=8, vocab_size=self.table.shape[1])

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.hidden[: input_ids.shape[0]]

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        return ForwardOutput(self.hidden[: batch.num_tokens])

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.table[: hidden.shape[0]]

    def positions(self, seq, start: int, end: int) -> torch.Tensor:
        return torch.arange(start, end, dtype=torch.float32).expand(3, -1)


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _timed(times: dict, name: str, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            times[name] += time.perf_counter() - t0
    return wrapper


def instrument(engine: AREngine) -> dict:
    """Wrap the engine's parts (as instance attributes) so each phase accumulates its seconds."""
    times: dict[str, float] = defaultdict(float)
    engine.scheduler.schedule = _timed(times, "schedule", engine.scheduler.schedule)
    engine.runner.prepare = _timed(times, "prepare", engine.runner.prepare)
    engine.runner.run = _timed(times, "run", engine.runner.run)
    graphs = engine.runner.graphs
    if graphs is not None:
        graphs._fill = _timed(times, "fill", graphs._fill)
    engine.runner.logits = _timed(times, "logits", engine.runner.logits)
    engine.sampler.sample = _timed(times, "sampler", engine.sampler.sample)  # eager steps (in a graph on CUDA)
    engine.model.after_sample = _timed(times, "after_sample", engine.model.after_sample)
    engine.step = _timed(times, "step", engine.step)
    return times


def phases(times: dict, steps: int) -> dict[str, float]:
    """µs per step by phase; `fill` is inside `run` (and inside `prepare` when the runner
    writes the static buffers directly), `sample` is logits + sampler + after_sample (the sampler
    runs inside `run` on the decode-graph path: it is taken out of `forward` there)."""
    us = {k: v * 1e6 / steps for k, v in times.items()}
    fill = us.get("fill", 0.0)
    sample = us.get("logits", 0.0) + us.get("sampler", 0.0) + us.get("after_sample", 0.0)
    in_run = us.get("sampler", 0.0) if not us.get("logits") else 0.0
    out = {"schedule": us.get("schedule", 0.0), "prepare": us.get("prepare", 0.0), "fill": fill,
           "forward": us.get("run", 0.0) - fill - in_run, "sample": sample}
    out["postprocess"] = us["step"] - sum(out.values())
    out["total"] = us["step"]
    return out


def bench(batch: int, steps: int, graphs: bool, device: str, prompt_len: int = 32) -> dict:
    model = NoOpModel(device=device)
    blocks = -(-(prompt_len + steps + 64) // 16)
    cfg = EngineConfig(block_size=16, num_blocks=batch * blocks + 8, max_num_seqs=batch, max_model_len=blocks * 16,
                       max_num_batched_tokens=max(2048, batch * prompt_len), device=device, cuda_graphs=graphs)
    engine = AREngine(model, cfg)
    for i in range(batch):
        prompt = [(7 * i + j) % 1000 + 1 for j in range(prompt_len)]
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=steps + 32, ignore_eos=True))
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.seqs.values()):
        engine.step()
    for _ in range(10):  # warm-up: the graph runner's static buffers for this batch
        engine.step()
    counter = OpCounter()
    with counter:
        for _ in range(5):
            engine.step()
    times = instrument(engine)
    for _ in range(steps):
        engine.step()
    result = {"batch": batch, "graphs": graphs, "device": device, "steps": steps,
              "aten_ops_per_step": counter.count / 5}
    result.update({f"{k}_us": round(v, 1) for k, v in phases(times, steps).items()})
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="1,16,64")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--no-graphs", action="store_true", help="the plain eager decode path")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [bench(int(b), args.steps, not args.no_graphs, args.device) for b in args.batch.split(",")]
    cols = ["batch", "aten_ops_per_step"] + [f"{p}_us" for p in PHASES] + ["total_us"]
    print(" ".join(f"{c:>14}" for c in cols))
    for r in rows:
        print(" ".join(f"{r[c]:>14}" for c in cols))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
