"""The code predictor's fused frame (`omni/layers/predictor_kernels.py`, `predictor_frame.py`)
against its eager loop.

CPU: the Triton kernels run in triton's interpreter in a child process (TRITON_INTERPRET=1 must be
set before triton is imported), float32: the fused frame must give exactly the eager
`CodePredictor.predict` codes and embeddings for the same seeds, greedy and sampled rows mixed,
with the projections whole or split over K (the sampler's top-k / top-p by radix select).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def interpreter_check(ckpt_dir: str) -> None:
    """Runs in the child process."""
    from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
    from omni.models.qwen3_omni.modules.talker import TalkerModel
    from omni.stages.codec_lm.code_predictor import sampled_codes
    from omni.stages.codec_lm.code_predictor_graphs import CodePredictorGraphs

    from omni.layers import predictor_kernels as pk

    talker = TalkerModel.from_checkpoint(make_tiny(ckpt_dir, seed=4, preset="tiny-b"))
    predictor = talker.code_predictor
    graphs = CodePredictorGraphs(predictor, 4, "cpu", fused=True)
    assert graphs.fused is not None
    for batch, split in ((1, 1), (3, 1), (3, 8)):  # the last: every projection split over K
        pk.LINEAR_TILES["norm"]["split"] = pk.LINEAR_TILES["plain"]["split"] = split
        gen = torch.Generator().manual_seed(batch)
        hidden = torch.randn(batch, talker.text_cfg.hidden_size, generator=gen)
        embed = talker.model.codec_embedding(torch.randint(0, 16, (batch,), generator=gen))
        temperature = torch.tensor([0.0 if i % 2 == 0 else 0.9 for i in range(batch)])
        seed, frame = torch.arange(batch) * 7 + 3, torch.arange(batch) + 5
        got = graphs.run(hidden, embed, temperature, seed, frame)
        want = predictor.predict(hidden, embed, sampled_codes(temperature, seed, frame, predictor.num_code_groups))
        assert torch.equal(got[0], want[0]), (got[0], want[0])
        assert torch.equal(got[1], want[1])
        assert len(set(got[0].flatten().tolist())) > 1
    assert not graphs.fused.counters.any()  # split-K calls leave their arrival counters at zero
    print("interpreter ok")


def test_fused_frame_equals_the_eager_loop_in_the_triton_interpreter(tmp_path):
    pytest.importorskip("triton", reason="triton is not installed (the kernels' CPU check needs its interpreter)")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    code = f"import test_predictor_kernels as t; t.interpreter_check({str(tmp_path / 'ckpt')!r})"
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=280, check=False)
    assert proc.returncode == 0 and "interpreter ok" in proc.stdout, proc.stderr[-4000:]


def test_kernels_compile_for_sm90_in_bf16():
    """Ahead of time for an H100/H200 (triton ships ptxas): what the interpreter lets by."""
    pytest.importorskip("triton", reason="triton is not installed")
    from test_fused_ops import _compile_for_sm90

    from omni.layers import predictor_kernels as pk

    ptrs = lambda *names, t="*bf16": {n: t for n in names}  # noqa: E731
    ints = lambda *names: {n: "i32" for n in names}  # noqa: E731
    linear = {**ptrs("x_ptr", "w_ptr", "nw_ptr", "b_ptr", "r_ptr", "o_ptr"), "ws_ptr": "*fp32", "cnt_ptr": "*i32",
              **ints("M", "N", "stride_xm", "stride_rm", "stride_om"), "eps": "fp32"}
    for norm, glu, split in ((True, False, 1), (True, True, 1), (False, False, 8), (True, True, 4)):
        _compile_for_sm90(pk._linear_kernel, linear, {"K": 1024, "NORM": norm, "GLU": glu, "BIAS": True, "RESID": not glu,
                                                      "IEEE": False, "BM": 16, "BN": 32, "BK": 128, "SPLIT": split}, 4)
    attention = {**ptrs("qkv_ptr", "k_cache", "v_cache", "qw_ptr", "kw_ptr", "cos_ptr", "sin_ptr", "out_ptr"),
                 **ints("start", "stride_qkv", "stride_out", "stride_cb", "stride_ch", "stride_cl", "stride_cs"),
                 "eps": "fp32", "scale": "fp32"}
    _compile_for_sm90(pk._attention_kernel, attention, {"T": 2, "Q_HEADS": 16, "KV_HEADS": 8, "HALF": 64,
                                                        "BLOCK_HALF": 64, "BLOCK_L": 16}, 4)
    sample = {"logits_ptr": "*bf16", "temp_ptr": "*fp32", "seed_ptr": "*i64", "frame_ptr": "*i64", "emb_ptr": "*bf16",
              "codes_ptr": "*i64", "embeds_ptr": "*bf16", "next_ptr": "*bf16",
              **ints("stride_l", "stride_codes", "stride_embeds", "stride_next", "top_k", "group", "groups_per_frame", "V"),
              "top_p": "fp32"}
    for radix in (False, True):
        _compile_for_sm90(pk._sample_embed_kernel, sample, {"H": 1024, "BV": 2048, "BH": 1024, "HAS_NEXT": False,
                                                            "RADIX": radix}, 4)
