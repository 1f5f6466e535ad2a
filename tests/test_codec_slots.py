"""The codec decoder's stream slots and CUDA graphs (omni/layers/codec/stream_slots.py,
codec_graphs.py): every stream's left context lives in one row of per-layer tensors, so a
batch gathers and writes back its rows by index. CPU: a reused row starts fresh, dropped streams
give their rows back, the slots grow without touching live streams, a snapshot forks; the
vocoder stage decodes a closed stream's last frames in the codec's fitting chunk lengths and
releases every stream it ends. GPU (marked `gpu`): graph replays equal the eager decode at every
batch bucket (padded) and chunk length, and after the slots grow; the same check runs on the CPU
with a recorder that replays eagerly (the padding, scratch rows and output copies)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from omni.kernel.stage import StageContext
from omni.layers.codec.codec_graphs import CodecGraphs, frame_sizes
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.modules.code2wav import Code2Wav
from omni.stages.vocoder import VocoderStage

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return Code2Wav.from_checkpoint(make_tiny(tmp_path_factory.mktemp("tiny-slots"), seed=1, preset="tiny-b"))


def _codes(model, batch: int, frames: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.cfg.codebook_size, (batch, model.cfg.num_quantizers, frames), generator=g)


def _streamed(model, codes: torch.Tensor, chunks: list[int], stream=None) -> torch.Tensor:
    stream = stream or model.new_stream()
    out, start = [], 0
    for n in chunks:
        out.append(model.decode(codes[:, :, start:start + n], [stream])[0])
        start += n
    return torch.cat(out)


def test_a_reused_slot_starts_fresh_and_dropped_streams_give_theirs_back(model):
    codes = _codes(model, 1, 9, seed=3)
    whole = model(codes)[0, 0]
    first = model.new_stream()
    _streamed(model, codes, [4, 5], first)
    row = first.slot
    model.release(first)
    again = model.new_stream()
    np.testing.assert_allclose(_streamed(model, codes, [4, 5], again), whole, atol=1e-5)
    assert again.slot == row  # the same row, its old context gone
    in_use = model._slots().in_use
    dropped = [model.new_stream() for _ in range(3)]
    model.decode(_codes(model, 3, 2, seed=4), dropped)
    assert model._slots().in_use == in_use + 3
    del dropped
    gc.collect()
    assert model._slots().in_use == in_use  # streams dropped without release gave their rows back


def test_a_cast_after_decoding_remakes_the_slots_in_the_new_dtype(tmp_path):
    """A decoder that decoded once (its random init's calibration does) and is then cast decodes in
    the new dtype: its slots are made again to match, not left in the old one."""
    m = Code2Wav.from_checkpoint(make_tiny(tmp_path / "cast", seed=2, preset="tiny-b"))
    m.decode(_codes(m, 1, 3, seed=5), [m.new_stream()])
    m.double()
    stream = m.new_stream()
    wav = m.decode(_codes(m, 1, 3, seed=6), [stream])[0]
    assert all(t.dtype == torch.float64 for t in m._slots().tensors.values())
    assert torch.isfinite(torch.as_tensor(wav)).all()
    m.release(stream)


def test_the_slots_grow_without_touching_live_streams(model):
    slots = model._slots()
    codes = _codes(model, 1, 10, seed=5)
    whole = model(codes)[0, 0]
    live = model.new_stream()
    head = model.decode(codes[:, :, :4], [live])[0]
    capacity = slots.capacity
    crowd = [model.new_stream() for _ in range(capacity + 1)]
    model.decode(_codes(model, len(crowd), 3, seed=6), crowd)  # more streams than rows: they double
    assert slots.capacity >= 2 * capacity
    tail = model.decode(codes[:, :, 4:], [live])[0]
    np.testing.assert_allclose(torch.cat([head, tail]), whole, atol=1e-5)
    for s in crowd:
        model.release(s)
    model.release(live)


def test_a_snapshot_forks_streams_that_continue_from_it(model):
    codes = _codes(model, 1, 12, seed=7)
    whole = model(codes)[0, 0]
    base = model.new_stream()
    head = model.decode(codes[:, :, :5], [base])[0]
    snap = model.snapshot(base)
    assert snap.slot == 0 and base.slot == 0
    a, b = snap.fork(), snap.fork()
    tail_a = model.decode(codes[:, :, 5:], [a])[0]
    tail_b = model.decode(codes[:, :, 5:8], [b])[0]  # b advancing does not move a, nor the snapshot
    np.testing.assert_allclose(torch.cat([head, tail_a]), whole, atol=1e-5)
    np.testing.assert_allclose(tail_b, tail_a[: tail_b.shape[0]], atol=1e-5)
    np.testing.assert_allclose(model.decode(codes[:, :, 5:], [snap.fork()])[0], tail_a, atol=1e-5)


class FittingCode2Wav(Code2Wav):
    """Says chunks of 1, 2 and 4 frames decode fastest (as captured graphs would)."""

    def fit_frames(self, frames: int) -> int:
        return max(n for n in (1, 2, 4) if n <= frames)


def test_the_stage_decodes_a_last_chunk_in_fitting_lengths_and_releases_every_stream(model, tmp_path):
    fitting = FittingCode2Wav(model.cfg)
    fitting.load_state_dict(model.state_dict())
    stage = VocoderStage(StageContext(name="vocoder", args={"first_chunk_frames": 4, "chunk_frames": 8}),
                         codec=fitting)
    codes = _codes(model, 1, 19, seed=8)  # 4 + 8, then 7 left at close: 4, 2, 1
    stage.open("r", {})
    stage.feed("r", "codes", {"codes": codes[0].T.numpy()})
    stage.close_input("r")
    pieces, lengths = [], []
    while stage.has_work():
        for e in stage.step():
            if e.data is not None:
                pieces.append(e.data["pcm"])
                lengths.append(len(e.data["pcm"]))
    assert [n // fitting.samples_per_frame for n in lengths[1:]] == [8, 4, 2, 1]
    np.testing.assert_allclose(np.concatenate(pieces), model(codes)[0, 0].numpy(), atol=1e-5)
    assert "r" not in stage.requests and fitting._slots().in_use == 0
    stage.open("gone", {})
    stage.feed("gone", "codes", {"codes": codes[0, :, :4].T.numpy()})
    stage.step()
    assert fitting._slots().in_use == 1
    stage.abort("gone")
    assert fitting._slots().in_use == 0


def test_graph_frame_sizes_cover_every_chunk_of_a_stream():
    assert frame_sizes(4, 12) == (1, 2, 4, 8, 12)
    assert frame_sizes(1, 12) == (1, 2, 4, 8, 12)
    assert frame_sizes(10, 3) == (1, 2, 3, 10)


class EagerRecorder(CodecGraphs):
    """Records a shape as a closure that re-runs the decoder's step on the same input buffers,
    so the graphs' padding, scratch rows and output copies run on the CPU."""

    def record(self, codes, meta, trim):
        out, consumed = self.step(codes, meta, trim)
        return (lambda: out.copy_(self.step(codes, meta, trim)[0])), out, consumed


class RecordedCode2Wav(Code2Wav):
    graphs_class = EagerRecorder


def _graphs_equal_eager(model, graphed, eager, device: str) -> None:
    assert graphed.capture_graphs(4, 8, max_batch=16) > 0
    schedule = [4, 8, 8, 4, 2, 1]  # first, steady, and a last chunk split as fit_frames does
    assert all(graphed.fit_frames(n) == n for n in (1, 2, 4, 8)) and graphed.fit_frames(7) == 4
    for batch in (1, 3, 16):  # 3: padded to the bucket of 4
        codes = _codes(model, batch, sum(schedule), seed=batch).to(device)
        s_eager = [eager.new_stream() for _ in range(batch)]
        s_graph = [graphed.new_stream() for _ in range(batch)]
        start = 0
        for n in schedule:
            want = eager.decode(codes[:, :, start:start + n], s_eager)
            replays = graphed._graphs.replays
            got = graphed.decode(codes[:, :, start:start + n], s_graph)
            assert graphed._graphs.replays == replays + 1
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
            start += n
        assert [s.samples for s in s_graph] == [s.samples for s in s_eager]
    crowd = [graphed.new_stream() for _ in range(graphed._slots().capacity + 1)]
    graphed.decode(_codes(model, 16, 4, seed=9).to(device), crowd[:16])
    graphed.decode(_codes(model, len(crowd) - 16, 4, seed=9).to(device), crowd[16:])  # the slots grow: graphs again
    codes = _codes(model, 2, 8, seed=10).to(device)
    a, b = [eager.new_stream() for _ in range(2)], [graphed.new_stream() for _ in range(2)]
    eager.decode(codes[:, :, :4], a), graphed.decode(codes[:, :, :4], b)
    replays = graphed._graphs.replays
    torch.testing.assert_close(graphed.decode(codes[:, :, 4:], b), eager.decode(codes[:, :, 4:], a),
                               atol=1e-5, rtol=1e-4)
    assert graphed._graphs.replays == replays + 1


def _copy(model, cls, device: str):
    copy = cls(model.cfg).to(device).eval()
    copy.load_state_dict(model.state_dict())
    return copy


def test_recorded_graphs_pad_batches_and_equal_the_eager_decode(model):
    _graphs_equal_eager(model, _copy(model, RecordedCode2Wav, "cpu"), _copy(model, Code2Wav, "cpu"), "cpu")


@pytest.mark.gpu
def test_graph_replays_equal_the_eager_decode_on_cuda(model):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _graphs_equal_eager(model, _copy(model, Code2Wav, "cuda"), _copy(model, Code2Wav, "cuda"), "cuda")
