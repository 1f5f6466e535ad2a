"""Serving never records autograd history. The thinker's soak growth (bench/RESULTS.md, 2026-12-02 soak
re-run) was a tap buffer written, step after step, from prompt embeddings that required grad (the
checkpoint's parameters did): its autograd chain held every step's slot and row index tensors."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.modules.thinker import Qwen3OmniThinker
from omni.stages.ar.config import EngineConfig
from omni.stages.ar.engine import AREngine
from omni.stages.ar.model_api import SeqSpan
from omni.stages.ar.tap_store import TapStore


def test_the_tap_store_never_joins_an_autograd_graph():
    store = TapStore(num_slots=16, block_size=4, device="cpu")
    weight = torch.randn(8, 3, requires_grad=True)  # as a checkpoint's embedding may come
    for step in range(3):
        seq = SimpleNamespace(block_table=[1, 2])
        rows = weight[torch.arange(step, step + 5)] * 2  # embeddings built outside inference mode
        store.write([SeqSpan(seq, 0, 5, 0)], {0: rows})
    assert store.rows[0].grad_fn is None and not store.rows[0].requires_grad
    got = store.read([1, 2], 0, 5, (0,))[0]
    assert got.grad_fn is None and torch.equal(got, (weight[2:7] * 2).detach())


def test_an_engine_turns_its_models_autograd_off(tmp_path):
    model = Qwen3OmniThinker.from_checkpoint(make_tiny(tmp_path / "tiny", seed=1, preset="tiny-b"))
    assert any(p.requires_grad for p in model.parameters())  # what a checkpoint load leaves
    AREngine(model, EngineConfig(num_blocks=8, block_size=16, max_num_seqs=2, max_model_len=64))
    assert not any(p.requires_grad for p in model.parameters())
