"""Where the fused code-predictor frame's GPU time goes: torch profiler over eager fused frames, per kernel.

Run:  python bench/predictor_fused_profile.py [--batch 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from omni.models.qwen3_omni.checkpoint.presets_full import full_config  # noqa: E402
from omni.models.qwen3_omni.config import load_config  # noqa: E402
from omni.stages.codec_lm.code_predictor_graphs import CodePredictorGraphs  # noqa: E402
from predictor_fused_gpu import _inputs  # noqa: E402
from talker_step_gpu import build_predictor  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=1)
a = ap.parse_args()
with tempfile.TemporaryDirectory() as tmp:
    (Path(tmp) / "config.json").write_text(json.dumps(full_config()))
    cfg = load_config(tmp)
model = build_predictor(cfg, "cuda", torch.bfloat16)
g = CodePredictorGraphs(model, a.batch, "cuda", fused=True)
g.capture = False
args = _inputs(model, a.batch, "cuda")
for _ in range(3):
    g.run(*args)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        g.run(*args)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))
