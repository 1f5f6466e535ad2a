"""Every SDPA call of omni goes through `omni.layers.attention.sdpa`, which leaves out cuDNN's
backend: it builds an execution plan per new shape (0.7-1.1 s on an H200 for a 96-row prefill,
bench/tts_first_use.py), which a server would pay at every new prompt length."""

from __future__ import annotations

import ast
from pathlib import Path

import torch
import torch.nn.functional as F

from omni.layers.attention import sdpa

OMNI = Path(__file__).resolve().parent.parent / "omni"


def test_sdpa_is_torchs_attention_with_the_same_arguments():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 16, generator=g) for _ in range(3))
    mask = torch.rand(2, 1, 7, 7, generator=g) > 0.3
    mask[..., 0] = True  # no row without a key
    for kwargs in ({}, {"is_causal": True}, {"attn_mask": mask}, {"attn_mask": mask, "scale": 0.1}):
        torch.testing.assert_close(sdpa(q, k, v, **kwargs), F.scaled_dot_product_attention(q, k, v, **kwargs),
                                   rtol=0, atol=0)


def test_sdpa_runs_off_the_cpu_without_the_cudnn_backend_and_restores_it(monkeypatch):
    seen = []

    def spy(q, k, v, **kwargs):
        seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(),
                     torch.backends.cuda.mem_efficient_sdp_enabled()))
        return q

    before = torch.backends.cuda.cudnn_sdp_enabled()
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    on_device = [torch.zeros(1, 1, 2, 4, device="meta") for _ in range(3)]  # any device but the CPU
    sdpa(*on_device)
    assert seen == [(False, True, True)]
    sdpa(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4))  # the CPU: as it is
    assert seen[1] == (before, True, True)
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_no_module_calls_sdpa_but_through_the_shared_layer():
    callers = []
    for path in OMNI.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "scaled_dot_product_attention":
                callers.append(str(path.relative_to(OMNI)))
    assert set(callers) == {"layers/attention.py"}, callers
