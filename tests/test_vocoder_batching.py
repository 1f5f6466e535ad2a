"""The vocoder decodes every due stream in a step, in one forward per chunk shape: with the codec on
a GPU, 64+ streams share one forward, and a first chunk rides with later chunks of its shape; each
stream's PCM is what decoding it alone gives."""

from __future__ import annotations

import numpy as np

from omni.kernel.stage import StageContext
from omni.stages.vocoder import VocoderStage

GROUPS, SPF = 2, 4


class CountingCodec:
    """A causal toy codec that says it runs on a GPU: sample j of a frame is its codes' sum plus the
    stream's running total, so a stream's PCM depends on all its history (as a real codec's does)."""

    sample_rate, num_groups, codebook_size, device = 24000, GROUPS, 50, "cuda:0"

    def __init__(self) -> None:
        self.batches: list[int] = []

    def new_stream(self):
        return {"total": 0}

    def batch_key(self, stream):
        return ()

    def decode_frames(self, codes, streams):
        self.batches.append(len(streams))
        out = np.zeros((len(streams), codes.shape[1] * SPF), np.float32)
        for b, s in enumerate(streams):
            for t in range(codes.shape[1]):
                s["total"] += int(codes[b, t].sum())
                out[b, t * SPF:(t + 1) * SPF] = s["total"] + np.arange(SPF)
        return out


def _run(streams: int, start_round: dict[str, int], frames: int, **args):
    codec = CountingCodec()
    stage = VocoderStage(StageContext(name="vocoder", args={"first_chunk_frames": 1, "chunk_frames": 1, **args}),
                         codec=codec)
    g = np.random.default_rng(0)
    codes = {f"s{i}": g.integers(0, 50, (frames, GROUPS)) for i in range(streams)}
    pcm = {rid: [] for rid in codes}
    forwards_per_step = []
    for k in range(frames + max(start_round.values()) + 1):
        for rid, c in codes.items():
            t = k - start_round[rid]
            if t == 0:
                stage.open(rid, {})
            if 0 <= t < frames:
                stage.feed(rid, "codes", {"codes": c[t:t + 1]})
            elif t == frames:
                stage.close_input(rid)
        before = len(codec.batches)
        for e in stage.step():  # one step decodes every chunk that is due
            if e.data is not None:
                pcm[e.rid].append(e.data["pcm"])
        assert not any(r.due() for r in stage.requests.values())
        forwards_per_step.append(len(codec.batches) - before)
    return codec, {rid: np.concatenate(p) for rid, p in pcm.items()}, codes, forwards_per_step


def test_64_streams_at_different_phases_share_one_forward_a_step():
    start = {f"s{i}": i % 3 for i in range(64)}  # first chunks and later ones arrive together
    codec, pcm, codes, per_step = _run(64, start, frames=6)
    assert max(codec.batches) == 64 and max(per_step) == 1  # one forward for every due stream
    for rid, c in codes.items():
        alone = CountingCodec().decode_frames(c[None], [{"total": 0}])[0]
        np.testing.assert_array_equal(pcm[rid], alone)


def test_a_max_batch_splits_a_step_but_decodes_every_due_stream():
    start = {f"s{i}": 0 for i in range(20)}
    codec, pcm, codes, per_step = _run(20, start, frames=3, max_batch=8)
    assert sorted(set(codec.batches)) == [4, 8] and max(per_step) == 3
    assert all(len(pcm[rid]) == 3 * SPF for rid in codes)
