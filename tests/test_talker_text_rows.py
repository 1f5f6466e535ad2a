"""Qwen3-Omni's talker projects the thinker's trailing text rows of every stream together (`DeferredRows`,
on CUDA): each request's rows arrive in its own order whatever the interleaving of feeds, are projected
when a step first reads one (or the stage flushes before its step), and equal the per-row projection
(within float32 rounding: one GEMM over many rows sums in another order); the whole graph with it on
gives the same tokens and codes for one request at a time, and every stream all its frames under load."""

from __future__ import annotations

import pytest
import torch

from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.modules.talker import TalkerModel
from omni.models.qwen3_omni.modules.talker_inputs import ASSISTANT_PREFIX_ROWS


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(make_tiny(tmp_path_factory.mktemp("q3o"), seed=2, preset="tiny-b"))


def _prompt(model: TalkerModel, n_user: int) -> list[int]:
    ids = model.ids
    return [ids.im_start, ids.user] + [11] * n_user + [ids.im_start, ids.assistant, 198]


def _streams(model: TalkerModel, defer: bool, seed: int = 0):
    """Three requests fed interleaved: their prompts, then rows one or two at a time; the trailing rows read."""
    model.defer_text_rows(defer)
    width = model.cfg.talker.thinker_hidden_size
    g = torch.Generator().manual_seed(seed)
    reqs = [model.new_request("ethan", True, 1, _prompt(model, 3 + i)) for i in range(3)]
    for req in reqs:  # the prompt and the first generated token's row: the prefill
        n = len(req.inputs.prompt_ids) + 1
        req.inputs.feed(torch.randn(n, width, generator=g), torch.randn(n, width, generator=g))
        assert req.inputs.prefill is not None
    for round_ in range(6):
        for i, req in enumerate(reqs):
            n = 1 + (round_ + i) % 2
            req.inputs.feed(torch.randn(n, width, generator=g), torch.randn(n, width, generator=g))
    waiting = model.text_rows_waiting()
    rows = [[req.inputs.trailing(k) for k in range(9)] for req in reqs]
    for req in reqs:
        req.inputs.finish()
    ends = [(req.inputs.trailing(len(r) + 0), req.inputs.trailing(len(r) + 3)) for req, r in zip(reqs, rows)]
    model.defer_text_rows(False)
    return rows, ends, waiting


def test_deferred_rows_equal_the_per_row_projection_in_order(ckpt):
    model = TalkerModel.from_checkpoint(ckpt)
    plain, plain_ends, _ = _streams(model, defer=False)
    batched, batched_ends, waiting = _streams(model, defer=True)
    assert waiting  # nothing was projected until a step read a row
    for a, b in zip(plain, batched):
        assert all(r is not None for r in a) and len(a) == len(b)
        for ra, rb in zip(a, b):
            torch.testing.assert_close(rb, ra, rtol=0, atol=1e-5)
    for (eos_a, pad_a), (eos_b, pad_b) in zip(plain_ends, batched_ends):
        assert torch.equal(eos_a, eos_b) and torch.equal(pad_a, pad_b)
    assert not model.text_rows_waiting() and ASSISTANT_PREFIX_ROWS == 4


def _speech(ckpt: str, requests: list[dict], defer: bool, device: str = "cpu") -> list:
    from omni.models.qwen3_omni.graph import build
    from omni.models.qwen3_omni.stages.talker_stage import TalkerStage
    from qwen3_fixtures import LoopThread, RunningKernel, expose_codes

    ready = TalkerStage.engine_ready

    def engine_ready(stage):  # the CUDA default, forced here on the CPU
        ready(stage)
        stage.model.defer_text_rows(defer)

    loop = LoopThread()
    try:
        TalkerStage.engine_ready = engine_ready
        graph, _ = build(ckpt, threads=1, device=device)
        with RunningKernel(loop, expose_codes(graph), mode="inline") as kernel:
            return kernel.many(requests)
    finally:
        TalkerStage.engine_ready = ready
        loop.close()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_graph_with_deferred_rows_speaks_as_without(ckpt, device):
    """One request alone: the same tokens and codes (one row a flush rounds as one row alone); four at once:
    the same tokens and every frame. On CUDA too (gpu-marked), where the stage defers by default."""
    from qwen3_fixtures import params, prompts

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")

    one = [params(prompts()["text"], "ethan", 10, 20, ignore_eos=True)]
    plain, deferred = _speech(ckpt, one, False, device), _speech(ckpt, one, True, device)
    assert deferred[0].tokens == plain[0].tokens and (deferred[0].codes == plain[0].codes).all()
    many = [params(prompts()["text"], voice, 6 + 2 * i, 12 + 5 * i, ignore_eos=True)
            for i, voice in enumerate(("ethan", "chelsie", "ethan", "chelsie"))]
    for a, b in zip(_speech(ckpt, many, False, device), _speech(ckpt, many, True, device)):
        assert b.tokens == a.tokens  # the thinker's: untouched
        assert b.codes is not None and b.codes.shape == a.codes.shape  # every frame of every stream
