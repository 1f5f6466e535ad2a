"""`ShapeGraphs` (omni/layers/graph_capture.py) without a GPU, with stand-in graphs: rows padded up to a
captured count, every call's output its own copy (graphs sharing a pool write over each other's
outputs), other shapes eager, and the start-up check that refuses graphs that replay wrong."""

from __future__ import annotations

import torch

from omni.layers.graph_capture import ShapeGraphs


class _Replay:
    """A captured graph's stand-in: replays `fn` from the static input into the static output."""

    def __init__(self, fn, static, out):
        self.fn, self.static, self.out = fn, static, out

    def replay(self):
        self.out.copy_(self.fn(self.static))


def _graphs(replayed):
    graphs = ShapeGraphs(lambda x: 2 * x, "cpu")
    for rows in (2, 4):
        static, out = torch.zeros(rows, 3), torch.zeros(rows, 3)
        graphs.graphs[(rows, 3)] = (_Replay(replayed, static, out), static, out)
    return graphs


def test_rows_pad_to_the_fewest_captured_and_each_output_is_a_copy():
    graphs = _graphs(lambda x: 2 * x)
    a = graphs(torch.ones(3, 3))  # the 4-row graph, one zero row of padding
    assert torch.equal(a, torch.full((3, 3), 2.0)) and graphs.replays == 1
    b = graphs(torch.full((3, 3), 5.0))  # the same graph again: `a` must not change
    assert torch.equal(a, torch.full((3, 3), 2.0)) and torch.equal(b, torch.full((3, 3), 10.0))
    assert torch.equal(graphs(torch.ones(5, 3)), torch.full((5, 3), 2.0)) and graphs.replays == 2  # eager: too many rows
    assert torch.equal(graphs(torch.ones(1, 4)), torch.full((1, 4), 2.0)) and graphs.replays == 2  # eager: other width


def test_graphs_that_replay_otherwise_than_the_eager_forward_are_refused():
    g = torch.Generator().manual_seed(0)
    probes = [torch.randn(1, 3, generator=g), torch.randn(4, 3, generator=g)]
    assert _graphs(lambda x: 2 * x).agrees(probes)
    assert not _graphs(lambda x: 2 * x + 0.1).agrees(probes)
