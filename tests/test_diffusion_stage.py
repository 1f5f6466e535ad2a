"""The generic diffusion stage's parts: the solvers step as transformers' RK4 does, the time grid is
the reference's sway-sampled one, windows are block-aligned with their context, seeded noise drawn
frame by frame equals one whole draw, and the vocoder's chunked decode equals its whole decode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni.stages.args import DiffusionArgs
from omni.stages.diffusion import NoiseStream
from omni.stages.diffusion_windows import Chunking, Window
from omni.stages.ode import RK4, Euler, Progress, solver_named, time_grid


def _f(t, y):
    return torch.sin(3 * t) * y + t


def _solve(solver, y0, grids, starts):
    """Rows solved together as the stage does: row i joins at step starts[i] (so rows sit at different
    sub-steps of different intervals), each with its own grid; every step one batched point and update."""
    rows, k = y0.shape[0], solver.stages
    y, ks = torch.zeros_like(y0), torch.zeros(k, *y0.shape)
    progress, evals, step = [None] * rows, [0] * rows, 0
    while any(p is None or not p.done for p in progress):
        for i in range(rows):
            if progress[i] is None and step >= starts[i]:
                progress[i], y[i] = Progress(solver, grids[i]), y0[i]
        live = [i for i in range(rows) if progress[i] is not None and not progress[i].done]
        now = {i: progress[i].now() for i in live}
        t = torch.tensor([now[i][0] if i in now else 0.0 for i in range(rows)])
        h = torch.tensor([now[i][1] if i in now else 0.0 for i in range(rows)]).view(rows, 1, 1)
        stage = torch.tensor([now[i][2] if i in now else 0 for i in range(rows)])
        x = solver.points(y, ks, h, stage)
        ks[stage, torch.arange(rows)] = _f(t.view(rows, 1, 1), x)
        last = (stage == k - 1).view(rows, 1, 1) & torch.tensor([i in now for i in range(rows)]).view(rows, 1, 1)
        y = torch.where(last, solver.update(y, ks, h), y)
        for i in live:
            assert progress[i].evals_left == (len(grids[i]) - 1) * k - evals[i]
            progress[i].advance()
            evals[i] += 1
        step += 1
    return y, evals


def test_rk4_equals_transformers_solver_row_by_row():
    """Rows at different intervals and sub-steps, on different grids, in one batch: each row exactly
    what transformers' solver computes for it alone."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

    y0 = torch.randn(4, 5, 3, generator=torch.Generator().manual_seed(0))
    grids = [time_grid(10, -1.0), time_grid(10, -1.0), time_grid(6, None), time_grid(10, -0.5)]
    y, evals = _solve(RK4, y0, grids, starts=[0, 3, 5, 17])
    assert evals == [(len(g) - 1) * 4 for g in grids]
    for i, g in enumerate(grids):
        ref = RungeKutta4ODESolver(_f, y0[i:i + 1]).integrate(torch.from_numpy(g))[-1][0]
        assert torch.equal(y[i], ref), i


def test_time_grid_is_the_references_sway_sampling():
    t = torch.linspace(0, 1, 10)
    assert np.array_equal(time_grid(10, -1.0), (t + -1.0 * (torch.cos(torch.pi / 2 * t) - 1 + t)).numpy())
    assert np.array_equal(time_grid(4), torch.linspace(0, 1, 4).numpy())


def test_euler_and_unknown_solvers():
    y, _ = _solve(Euler, torch.ones(1, 1, 1), [time_grid(3)], starts=[0])
    ref = torch.ones(1)
    for t0, t1 in zip(time_grid(3)[:-1], time_grid(3)[1:]):
        ref = ref + float(t1 - t0) * _f(torch.tensor(t0), ref)
    assert torch.allclose(y.reshape(1), ref)
    with pytest.raises(ValueError):
        solver_named("dopri5")
    with pytest.raises(ValueError):
        DiffusionArgs(num_steps=1)


def test_windows_are_aligned_and_wait_for_their_right_context():
    c = Chunking.in_blocks(align=4, first=1, chunk=2, left=1, right=1)
    assert c.next_window(0, 7, False) is None  # chunk [0, 4) needs tokens up to 8
    assert c.next_window(0, 8, False) == Window(0, 0, 4, 8, False)
    assert c.next_window(4, 15, False) is None
    assert c.next_window(4, 16, False) == Window(0, 4, 12, 16, False)
    assert c.next_window(12, 14, True) == Window(8, 12, 14, 14, True)
    assert c.next_window(14, 14, True) is None
    whole = Chunking.in_blocks(4, 0, 3, 2, 1)
    assert whole.next_window(0, 9, False) is None and whole.next_window(0, 9, True) == Window(0, 0, 9, 9, True)


def test_growing_chunks_as_long_as_the_audio_out_up_to_the_longest():
    c = Chunking.in_blocks(align=4, first=2, chunk=8, left=2, right=1, grow=True)
    assert c.schedule(6) == [8, 8, 16, 32, 32, 32]
    assert c.next_window(8, 19, False) is None  # chunk [8, 16) waits for one block after it
    assert c.next_window(8, 20, False) == Window(0, 8, 16, 20, False)
    assert c.next_window(32, 80, True) == Window(24, 32, 64, 68, False)
    assert c.longest_window == 4 * (2 + 8 + 1) and Chunking.in_blocks(4, 0, 3, 2, 1).longest_window == 0
    assert Chunking.in_blocks(4, 2, 8, 2, 1).schedule(3) == [8, 32, 32]


@pytest.mark.parametrize("dim", [80, 32, 24])
def test_seeded_noise_drawn_in_pieces_equals_one_draw(dim):
    torch.manual_seed(5)
    whole = torch.randn([1, 50, dim], dtype=torch.float32)[0]
    noise = NoiseStream(5, dim, max_frames=64)
    for upto in (1, 3, 20, 50):
        assert torch.equal(noise.upto(upto), whole[:upto])


def test_the_vocoder_streamed_equals_its_whole_decode(tmp_path):
    from omni.models.qwen2_5_omni.checkpoint.make_tiny import make_tiny
    from omni.models.qwen2_5_omni.modules.token2wav import MelStream, Token2Wav

    model = Token2Wav.from_checkpoint(make_tiny(tmp_path / "t", preset="tiny-a"))
    voc = model.code2wav_bigvgan_model
    mel = torch.randn(1, 80, 100, generator=torch.Generator().manual_seed(1)) * 2 - 3
    with torch.inference_mode():
        whole = voc(mel)[0]
        stream, pieces = MelStream(voc, voc.context_frames()), []
        for a in range(0, 100, 7):
            pcm = stream.push(mel[0, :, a:a + 7].T, last=a + 7 >= 100)
            if pcm is not None:
                pieces.append(pcm)
    streamed = torch.cat(pieces)
    assert streamed.shape == whole.shape
    assert (streamed - whole).abs().max() <= 1e-5 * whole.abs().max()
