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


def test_a_masked_gqa_call_off_the_cpu_repeats_the_keys_instead_of_falling_to_math(monkeypatch):
    """Flash takes no mask, memory-efficient attention no GQA: a masked GQA call would run on the
    float32 math backend. `sdpa` repeats the key/value heads (in their dtype) and drops enable_gqa."""
    seen = []

    def spy(q, k, v, **kwargs):
        seen.append((k.shape, v.shape, kwargs.get("enable_gqa")))
        return q

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    q = torch.zeros(2, 8, 1, 4, device="meta")
    kv = torch.zeros(2, 2, 5, 4, device="meta")
    mask = torch.zeros(2, 1, 1, 5, dtype=torch.bool, device="meta")
    sdpa(q, kv, kv, attn_mask=mask, enable_gqa=True)
    sdpa(q, kv, kv, enable_gqa=True)  # no mask: flash takes GQA as it is
    assert seen == [((2, 8, 5, 4), (2, 8, 5, 4), False), ((2, 2, 5, 4), (2, 2, 5, 4), True)]


def test_repeating_the_key_heads_is_the_same_attention_as_gqa():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, n, 8, generator=g) for h, n in ((8, 3), (2, 6), (2, 6)))
    mask = torch.rand(2, 1, 3, 6, generator=g) > 0.3
    mask[..., 0] = True
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    got = F.scaled_dot_product_attention(q, k.repeat_interleave(4, dim=-3), v.repeat_interleave(4, dim=-3),
                                         attn_mask=mask)
    torch.testing.assert_close(got, want)


def test_the_engine_takes_the_triton_decode_kernel_on_cuda_only_and_quietly_elsewhere(caplog):
    from omni.layers.paged_attention import allocate_kv_cache
    from omni.stages.ar.config import EngineConfig
    from omni.stages.ar.engine import decode_kernel

    cpu_cache = allocate_kv_cache(1, 2, 16, 1, 8, torch.float32, "cpu")
    assert EngineConfig().attention_backend == "auto"
    with caplog.at_level("WARNING"):
        assert decode_kernel(EngineConfig(), cpu_cache) is None
        assert decode_kernel(EngineConfig(attention_backend="torch"), cpu_cache) is None
    assert not caplog.records
    assert decode_kernel(EngineConfig(attention_backend="triton"), cpu_cache) is None
    assert "unavailable" in caplog.text
