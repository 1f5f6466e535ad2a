"""q/k/v and gate/up fused into one GEMM each (omni/layers/fused_linear.py): the fused projection
gives the parts' outputs side by side, the parts' weights become views of its (no second copy, and a
later in-place load reaches both), modules with other linears are left alone, and it runs only where
the fused ops run (CUDA), so the CPU parity paths keep their exact GEMMs."""

from __future__ import annotations

import torch
from torch import nn

from omni.layers import fused_ops
from omni.layers.attention import QKVProjection
from omni.layers.fused_linear import fuse_linears, fuse_model_projections
from omni.layers.mlp import GatedMLP
from omni.layers.rotary import rope_inv_freq


def test_a_fused_projection_is_the_parts_side_by_side_and_shares_their_memory():
    torch.manual_seed(0)
    parts = [nn.Linear(8, n, bias=True) for n in (6, 4, 4)]
    x = torch.randn(3, 8)
    want = torch.cat([p(x) for p in parts], dim=-1)
    fused = fuse_linears(*parts)
    torch.testing.assert_close(fused(x), want, rtol=1e-6, atol=1e-6)
    assert all(p.weight.untyped_storage().data_ptr() == fused.weight.untyped_storage().data_ptr() for p in parts)
    with torch.no_grad():
        parts[1].weight.zero_()  # a later load into a part lands in the fused weight
    assert fused.weight[6:10].abs().sum() == 0


def test_other_module_types_or_dtypes_are_not_fused():
    class Other(nn.Linear):
        pass

    assert fuse_linears(nn.Linear(8, 4), Other(8, 4)) is None
    assert fuse_linears(nn.Linear(8, 4), nn.Linear(8, 4).to(torch.float64)) is None
    assert fuse_linears(nn.Linear(8, 4, bias=False), nn.Linear(8, 4)) is None


def test_fused_attention_and_mlp_give_the_unfused_outputs():
    torch.manual_seed(1)
    attn, mlp = QKVProjection(16, 4, 2, 8, 1e-6, bias=True), GatedMLP(16, 24)
    x = torch.randn(5, 16)
    pos = torch.arange(5, dtype=torch.float32)
    freqs = pos[:, None] * rope_inv_freq(8, 10000.0)[None]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    want_qkv, want_mlp = attn.qkv(x, cos, sin), mlp(x)
    assert attn.fuse_projections() and mlp.fuse_projections()
    for got, want in zip(attn.qkv(x, cos, sin), want_qkv):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mlp(x), want_mlp, rtol=1e-5, atol=1e-6)


def test_models_fuse_only_where_the_fused_ops_run(monkeypatch):
    model = nn.Sequential(QKVProjection(16, 4, 2, 8, 1e-6), GatedMLP(16, 24))
    assert fuse_model_projections(model) == 0  # CPU weights: left as they are
    assert model[0].qkv_proj is None and model[1].gate_up_proj is None
    monkeypatch.setattr(fused_ops, "enabled", lambda x: True)  # as on CUDA with triton
    assert fuse_model_projections(model) == 2
    assert model[0].qkv_proj is not None and model[1].gate_up_proj is not None


def test_a_second_engine_on_the_same_model_keeps_the_first_fused_weights(monkeypatch):
    """A CUDA graph captured by the first engine reads the fused weight's memory: fusing again (a second
    stage set up on the same model object) must leave that tensor in place, not allocate a new one."""
    model = nn.Sequential(QKVProjection(16, 4, 2, 8, 1e-6), GatedMLP(16, 24))
    monkeypatch.setattr(fused_ops, "enabled", lambda x: True)
    assert fuse_model_projections(model) == 2
    first = (model[0].qkv_proj.weight.data_ptr(), model[1].gate_up_proj.weight.data_ptr())
    assert fuse_model_projections(model) == 2
    assert (model[0].qkv_proj.weight.data_ptr(), model[1].gate_up_proj.weight.data_ptr()) == first
    assert model[0].q_proj.weight.untyped_storage().data_ptr() == model[0].qkv_proj.weight.untyped_storage().data_ptr()


def test_parts_replaced_since_the_fusion_are_fused_again_or_not_at_all(monkeypatch):
    """Quantizing q/k/v in place (FP8 modules, not nn.Linear) after an engine fused them: the next fusion
    drops the stale bf16 projection rather than keep computing with it."""
    attn = QKVProjection(16, 4, 2, 8, 1e-6)
    monkeypatch.setattr(fused_ops, "enabled", lambda x: True)
    assert fuse_model_projections(attn) == 1
    attn.q_proj = nn.Identity()  # stands for an in-place replacement (e.g. Fp8Linear)
    assert fuse_model_projections(attn) == 0 and attn.qkv_proj is None
