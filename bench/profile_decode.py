"""Where a thinker decode step's time goes: torch.profiler over the full-size Qwen3-Omni thinker
(random bf16 weights, omni's AR engine, CUDA graphs) at batch 1 and 16.

Per batch: prefill, warm-up steps (graph capture), `--timed` steps without the profiler (TPOT),
then `--steps` engine steps under torch.profiler (CPU + CUDA). Reported per step: wall time,
GPU busy time (union of kernels, memcpys, memsets) and the rest (host: Python, batch build,
sampling, launch gaps), kernels per step, the top-25 kernels (time, share, count), time per
category, and the bytes an ideal step reads against the HBM roofline. Categories come from a
second, eager run whose modules are wrapped in record_function scopes (profile_trace.py).
Writes `profile.json`, `profile.md` and a small gzip chrome trace of two steps per batch.

Each MoE backend runs in a child process that forces it (`moe_routed.use_moe_backend`, what a
stage's `moe_backend` arg does).

Run:  python bench/profile_decode.py --out-dir OUT [--batch 1,16] [--steps 10] [--backends grouped,triton]
          [--mode graphs|graphs+triton] [--scaled --device cpu]   (a CPU dry run)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import profile_trace  # noqa: E402
from profile_roofline import roofline, markdown  # noqa: E402
from report import machine, now_iso, say  # noqa: E402

STEP = "decode_step"


def make_engine(model, batch: int, prompt_len: int, steps: int, engine_args: dict, device: str):
    """An engine holding `batch` prefilled requests with room for `steps` more tokens each."""
    import torch

    from omni.stages.ar.config import EngineConfig
    from omni.stages.ar.engine import AREngine
    from omni.stages.ar.sequence import SamplingParams

    blocks = -(-(prompt_len + steps + 16) // 16)
    cfg = EngineConfig(block_size=16, num_blocks=batch * blocks + 8, max_num_seqs=batch, max_model_len=blocks * 16,
                       max_num_batched_tokens=max(2048, batch * prompt_len), device=device,
                       cuda_graph_max_batch=batch, **engine_args)
    engine = AREngine(model, cfg)
    gen = torch.Generator().manual_seed(batch)
    vocab = min(model.cfg.text.vocab_size, 150000)
    for i in range(batch):
        engine.add_request(f"r{i}", torch.randint(0, vocab, (prompt_len,), generator=gen).tolist(),
                           SamplingParams(temperature=0.0, max_tokens=steps + 4, ignore_eos=True))
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.seqs.values()):
        engine.step()
    return engine


def profiled_steps(engine, n: int, device: str, trace_path: str, annotate: str = STEP) -> list[dict]:
    """Run `n` engine steps under torch.profiler, each in a `<annotate><i>` range; the trace's events."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from gpu_decode import sync

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    sync(device)
    with profile(activities=activities) as prof:
        for i in range(n):
            with record_function(f"{annotate}{i}"):
                engine.step()
        sync(device)
    prof.export_chrome_trace(trace_path)
    return profile_trace.load(trace_path)


class Scopes:
    """Wraps the thinker's modules (and the MoE / rope functions) in `cat:<category>` profiler scopes."""

    def __init__(self, model) -> None:
        from torch.profiler import record_function

        from omni.layers import attention, fused_ops, moe
        from omni.models.qwen3_omni.modules import thinker

        self.rf, self.handles, self.patches, self.stack = record_function, [], [], []
        for name, mod in model.named_modules():
            cat = self._category(name, type(mod).__name__)
            if cat:
                self.handles.append(mod.register_forward_pre_hook(lambda m, a, c=cat: self._enter(c)))
                self.handles.append(mod.register_forward_hook(lambda m, a, o: self._exit()))
        for owner, attr, cat in ((moe, "routed_experts", "MoE experts"), (attention, "apply_rope", "rope"),
                                 (fused_ops, "qk_norm_rope", "rope"), (thinker, "mrope_cos_sin", "rope"),
                                 (moe, "grouped_experts", "MoE experts"),
                                 (moe, "per_expert", "MoE experts")):
            fn = getattr(owner, attr, None)
            if fn is not None:
                self.patches.append((owner, attr, fn))
                setattr(owner, attr, self._wrap(fn, cat))

    @staticmethod
    def _category(name: str, kind: str) -> str | None:
        last = name.rsplit(".", 1)[-1]
        if last in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
            return "dense GEMMs (q/k/v/o proj)"
        return {"lm_head": "lm_head"}.get(name) or {
            "RMSNorm": "norms", "Attention": "attention", "SparseMoE": "MoE routing",
            "DecoderLayer": "residual/elementwise"}.get(kind) or ("residual/elementwise" if name == "" else None)

    def _enter(self, cat: str) -> None:
        scope = self.rf(profile_trace.SCOPE_PREFIX + cat)
        scope.__enter__()
        self.stack.append(scope)

    def _exit(self) -> None:
        self.stack.pop().__exit__(None, None, None)

    def _wrap(self, fn, cat: str):
        def scoped(*args, **kwargs):
            with self.rf(profile_trace.SCOPE_PREFIX + cat):
                return fn(*args, **kwargs)
        return scoped

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        for owner, attr, fn in self.patches:
            setattr(owner, attr, fn)


def profile_batch(model, batch: int, args, tmp: Path, out_dir: Path, tag: str) -> dict:
    import gc

    import torch

    from gpu_decode import MODES, sync

    # 1. categories: an eager run with module scopes
    eager = make_engine(model, batch, args.prompt_len, 8, {}, args.device)
    eager.step()
    scopes = Scopes(model)
    try:
        shares = profile_trace.attribution(profiled_steps(eager, 2, args.device, str(tmp / "eager.json"), "attr"))
    finally:
        scopes.close()
    del eager
    # 2. the mode under test: warm up (capture), time, profile
    total = args.warmup + args.timed + args.steps
    engine = make_engine(model, batch, args.prompt_len, total, MODES[args.mode], args.device)
    for _ in range(args.warmup):
        engine.step()
    sync(args.device)
    t0 = time.perf_counter()
    for _ in range(args.timed):
        engine.step()
    sync(args.device)
    tpot_ms = 1000 * (time.perf_counter() - t0) / max(args.timed, 1)
    events = profiled_steps(engine, args.steps, args.device, str(tmp / "graph.json"))
    stats = engine.stats()
    summary = profile_trace.summarize(events, STEP, shares)
    windows = profile_trace.step_windows(events, STEP)
    mid = min(2, len(windows) - 1)
    last = min(mid + args.trace_steps - 1, len(windows) - 1)
    trace = out_dir / f"trace_{tag}_b{batch}.json.gz"
    size = profile_trace.write_window(events, (windows[mid][0], windows[last][1]), trace)
    del engine
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"batch": batch, "mode": args.mode, "tpot_ms": round(tpot_ms, 3), "tok_per_s": round(batch * 1000 / tpot_ms, 1),
            "graphs": stats.get("graphs"), "graph_steps": stats.get("decode_graph_steps"),
            "graphs_disabled": stats.get("graphs_disabled"), **summary,
            "roofline": roofline(model.cfg, batch, args.prompt_len + total, summary, tpot_ms, args.hbm_tbps),
            "trace": trace.name, "trace_bytes": size}


def run_one(args) -> dict:
    """This process, this environment's MoE backend: every batch size."""
    import torch

    from gpu_decode import sync, thinker_config
    from omni.layers.moe_routed import use_moe_backend
    from omni.models.qwen3_omni.checkpoint.random_load import random_thinker

    use_moe_backend(None if args.backend == "default" else args.backend)

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = thinker_config(args.scaled, Path(tempfile.mkdtemp(prefix="omni-profile-cfg-")))
    t0 = time.perf_counter()
    model = random_thinker(cfg, args.device, torch.bfloat16, seed=0)
    sync(args.device)
    load_s = time.perf_counter() - t0
    say(f"[{args.backend}] thinker built in {load_s:.1f}s on {args.device}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="omni-profile-") as tmp:
        for b in (int(x) for x in args.batch.split(",")):
            t1 = time.perf_counter()
            try:
                row = profile_batch(model, b, args, Path(tmp), out_dir, args.backend)
            except Exception as exc:  # one failed batch must not hide the others
                row = {"batch": b, "error": f"{type(exc).__name__}: {exc}"[:400]}
            row["seconds"] = round(time.perf_counter() - t1, 1)
            say(f"[{args.backend}] batch {b}: " + json.dumps({k: row.get(k) for k in (
                "tpot_ms", "wall_us_per_step", "device_busy_us_per_step", "kernels_per_step", "error", "seconds")}))
            rows.append(row)
    return {"backend": args.backend, "machine": machine(),
            "load_s": round(load_s, 2), "rows": rows}


def child_command(args, backend: str, out_dir: Path) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", "--backend", backend, "--out-dir", str(out_dir),
           "--batch", args.batch, "--steps", str(args.steps), "--timed", str(args.timed), "--warmup", str(args.warmup),
           "--prompt-len", str(args.prompt_len), "--mode", args.mode, "--device", args.device,
           "--hbm-tbps", str(args.hbm_tbps), "--trace-steps", str(args.trace_steps)]
    return cmd + (["--scaled"] if args.scaled else [])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--steps", type=int, default=10, help="profiled engine steps per batch size")
    ap.add_argument("--timed", type=int, default=20, help="engine steps timed without the profiler")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--mode", default="graphs", choices=("eager", "graphs", "graphs+triton"))
    ap.add_argument("--backends", default="grouped,triton", help="MoE backends, one child process each")
    ap.add_argument("--backend", default="default", help=argparse.SUPPRESS)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scaled", action="store_true", help="test sizes (a dry run)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--hbm-tbps", type=float, default=4.8)
    ap.add_argument("--trace-steps", type=int, default=2)
    ap.add_argument("--deadline-s", type=float, default=115.0, help="no new backend starts after this")
    args = ap.parse_args(argv)
    if args.one:
        result = run_one(args)
        (Path(args.out_dir) / "result.json").write_text(json.dumps(result, indent=2) + "\n")
        return result
    t0 = time.perf_counter()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    backends = [b for b in args.backends.split(",") if b] or ["default"]
    results = []
    for backend in backends:
        left = args.deadline_s - (time.perf_counter() - t0)
        if left < 20:
            results.append({"backend": backend, "skipped": f"deadline: {left:.0f}s left"})
            continue
        cmd = child_command(args, backend, out / backend)
        say(f"profile_decode: backend {backend} ({left:.0f}s left)")
        try:
            proc = subprocess.run(cmd, timeout=left, check=False)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        path = out / backend / "result.json"
        result = json.loads(path.read_text()) if path.is_file() else {"backend": backend}
        results.append({**result, "returncode": rc})
    report = {"command": " ".join(["python", "bench/profile_decode.py", *(argv if argv is not None else sys.argv[1:])]),
              "date": now_iso(), "machine": machine(), "backend_env_supported": True,
              "seconds": round(time.perf_counter() - t0, 1), "backends": results}
    (out / "profile.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "profile.md").write_text(markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
