"""The generic diffusion stage's parts: the solvers step as transformers' RK4 does, the time grid is
the reference's sway-sampled one, windows are block-aligned with their context, seeded noise drawn
frame by frame equals one whole draw, and the vocoder's chunked decode equals its whole decode."""

from __future__ import annotations

import pytest
import torch

from omni.stages.args import DiffusionArgs
from omni.stages.diffusion import NoiseStream
from omni.stages.diffusion_windows import Chunking, Window
from omni.stages.ode import make_solver, time_grid


def _f(t, y):
    return torch.sin(3 * t) * y + t


def test_rk4_equals_transformers_solver():
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

    y0 = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0))
    grid = time_grid(10, -1.0)
    ref = RungeKutta4ODESolver(_f, y0).integrate(grid)[-1]
    solver = make_solver("rk4", y0, grid)
    evals = 0
    while not solver.done:
        assert solver.evals_left == 36 - evals
        solver.advance(_f(*solver.point()))
        evals += 1
    assert evals == 36 and torch.equal(solver.value, ref)


def test_time_grid_is_the_references_sway_sampling():
    t = torch.linspace(0, 1, 10)
    assert torch.equal(time_grid(10, -1.0), t + -1.0 * (torch.cos(torch.pi / 2 * t) - 1 + t))
    assert torch.equal(time_grid(4), torch.linspace(0, 1, 4))


def test_euler_and_unknown_solvers():
    y = make_solver("euler", torch.ones(1), time_grid(3))
    while not y.done:
        y.advance(torch.ones(1))
    assert torch.allclose(y.value, torch.tensor([2.0]))
    with pytest.raises(ValueError):
        make_solver("dopri5", torch.ones(1), time_grid(3))
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
