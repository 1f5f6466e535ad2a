"""Lookahead decode (omni/stages/ar/lookahead.py): the talker launches step N+1 before step N's codes
reach the host. Its frames equal the ordinary path's for the same seeds, whatever ends a stream (a
stop id sampled mid-stream, a length limit), with arrivals and aborts while a step is in flight.
Run through the decode-graph path, whose padded fixed-shape form runs eagerly on CPU."""

from __future__ import annotations

import numpy as np
import pytest

from kernel_helpers import unbatched
from omni.kernel.stage import StageContext
from omni.models.qwen3_tts.checkpoint.make_tiny import write_model
from omni.models.qwen3_tts.modules.talker import TTSTalkerModel
from omni.models.qwen3_tts.stages.preprocess_stage import PreprocessStage
from omni.models.qwen3_tts.stages.talker_stage import TTSTalkerStage

TEXTS = ("hello there, how are you today?", "a second line", "and a third, longer one to speak", "late one")


@pytest.fixture(scope="module")
def tts(tmp_path_factory):
    model_dir = write_model(tmp_path_factory.mktemp("tts"), "custom_voice", "tiny-a", seed=0)
    return model_dir, TTSTalkerModel.from_checkpoint(model_dir)


class Run:
    """A preprocess + talker pair driven step by step; frames and finish reasons per request."""

    def __init__(self, tts, lookahead: bool, device: str = "cpu") -> None:
        model_dir, model = tts
        self.pre = PreprocessStage(StageContext("preprocess", args={"model_dir": str(model_dir)}, out_ports=["prompt"]))
        self.pre.setup()
        self.talker = TTSTalkerStage(StageContext("talker", args={
            "model": model, "model_dir": str(model_dir), "num_blocks": 256, "block_size": 8, "max_model_len": 512,
            "cuda_graphs": True, "lookahead_decode": lookahead, "device": device}, in_ports=["prompt"], out_ports=["codes"]))
        self.talker.setup()
        self.frames: dict[str, list] = {}
        self.finished: set[str] = set()

    def open(self, i: int, max_tokens: int, stop: int | None = None) -> None:
        rid, p = f"r{i}", {"input": TEXTS[i], "voice": "vivian",
                           "sampling": {"talker": {"temperature": 0.9, "seed": 11 + i, "max_tokens": max_tokens}}}
        self.pre.open(rid, p), self.pre.close_input(rid), self.talker.open(rid, p)
        for e in self.pre.step():
            if e.port == "prompt":
                self.talker.feed(rid, "prompt", e.data)
        self.talker.close_input(rid)
        if stop is not None:  # a stop id the stream will draw (found by a run without it)
            seq = self.talker.engine.seqs[rid]
            seq.params.stop_token_ids = (*seq.params.stop_token_ids, stop)
        self.frames[rid] = []

    def step(self) -> None:
        for e in unbatched(self.talker.step()):
            assert e.error is None, e.error
            if e.data is not None and "codes" in e.data:
                assert e.rid not in self.finished
                self.frames[e.rid].append(e.data["codes"])
            if e.finish:
                self.finished.add(e.rid)

    def drain(self, limit: int = 400) -> dict[str, np.ndarray]:
        for _ in range(limit):
            if not self.talker.has_work():
                break
            self.step()
        assert not self.talker.has_work()
        return {rid: np.concatenate(f) if f else np.zeros((0,)) for rid, f in self.frames.items()}


def both(tts, script, device: str = "cpu") -> tuple[dict, dict, Run]:
    runs = [Run(tts, lookahead, device) for lookahead in (True, False)]
    out = [script(run) for run in runs]
    return out[0], out[1], runs[0]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_frames_equal_the_ordinary_path_with_stops_arrivals_and_aborts(tts, device):
    """On CUDA: the real overlap (graphs captured, the codes' copy to pinned memory in flight while
    the next step is queued)."""
    if device == "cuda":
        tts = (tts[0], TTSTalkerModel.from_checkpoint(tts[0]).to("cuda"))
    probe = Run(tts, False, device)
    probe.open(1, 40)
    drawn = probe.drain()["r1"][:, 0]
    stop = int(drawn[6])  # r1 draws it at frame 6 (or earlier): a stop id mid-stream
    first = int(np.flatnonzero(drawn == stop)[0])

    def script(run: Run) -> dict:
        run.open(0, 30)
        run.open(1, 40, stop=stop)
        run.open(2, 17)
        for _ in range(5):
            run.step()
        run.open(3, 9)  # arrives while steps run ahead
        for _ in range(3):
            run.step()
        run.talker.abort("r2")
        run.frames.pop("r2")
        return run.drain()

    ahead, plain, run = both(tts, script, device)
    assert run.talker.engine.num_lookahead_steps > 10
    assert set(ahead) == set(plain) == {"r0", "r1", "r3"}
    for rid in plain:
        np.testing.assert_array_equal(ahead[rid], plain[rid])
    assert len(ahead["r1"]) == first  # the stop id's token ends the stream: no frame for it
    assert len(ahead["r0"]) == 29 and len(ahead["r3"]) == 8  # max_tokens: the last token makes no frame
    assert run.finished >= {"r0", "r1", "r3"}
    engine = run.talker.engine
    assert not engine.seqs and engine.scheduler.blocks.num_free_blocks == engine.config.num_blocks


def test_lookahead_is_on_with_decode_graphs_and_off_without(tts):
    on, off = Run(tts, True), Run(tts, False)
    assert on.talker.engine.lookahead and not off.talker.engine.lookahead
    model_dir, model = tts
    eager = TTSTalkerStage(StageContext("talker", args={"model": model, "model_dir": str(model_dir), "num_blocks": 64, "block_size": 8,
                                                        "max_model_len": 512, "cuda_graphs": False}, in_ports=["prompt"], out_ports=["codes"]))
    eager.setup()
    assert not eager.engine.lookahead  # no decode graphs: nothing to launch ahead


def _speech_requests(sampled_from: int = 0) -> list[dict]:
    """Three chat requests with speech, of different lengths; from `sampled_from` on the talker samples."""
    from qwen3_fixtures import params, prompts

    requests = []
    for i, (voice, talker_tokens) in enumerate((("ethan", 24), ("chelsie", 31), ("ethan", 17))):
        p = params(prompts()["text"], voice, 8 + 2 * i, talker_tokens, ignore_eos=True)
        if i >= sampled_from:
            p["sampling"]["talker"].update(temperature=0.9, seed=3 + i)
        requests.append(p)
    return requests


def _assert_lookahead_changes_nothing(build, ckpt: str, requests: list[dict], **stage_args) -> None:
    """The whole graph with lookahead on, then off, for thinker and talker: both looked ahead (more than
    5 steps each) only when on, and every request's tokens and codes are the same."""
    from qwen3_fixtures import LoopThread, RunningKernel, expose_codes

    loop, results, steps = LoopThread(), {}, {}
    try:
        for lookahead in (True, False):
            ahead = {"cuda_graphs": True, "lookahead_decode": lookahead}
            graph, _ = build(ckpt, threads=1, stage_args={"thinker": ahead, "talker": ahead, **stage_args})
            with RunningKernel(loop, expose_codes(graph), mode="inline") as kernel:
                results[lookahead] = kernel.many(requests)
                stats = kernel.stats()
                steps[lookahead] = [stats[f"{s}.0"].get("num_lookahead_steps") for s in ("thinker", "talker")]
    finally:
        loop.close()
    assert min(steps[True]) > 5 and not any(steps[False])
    for ahead, plain in zip(results[True], results[False]):
        assert ahead.tokens == plain.tokens
        assert ahead.codes is not None and ahead.codes.shape == plain.codes.shape and (ahead.codes == plain.codes).all()


def test_qwen3_omni_speech_with_lookahead_equals_without(tmp_path):
    """The whole Qwen3-Omni graph, three requests at once (the talker waits on the thinker's streamed
    rows, so lookahead steps are also refused and rolled back; the thinker's lookahead steps take
    their ids on the device and stream their hidden rows): the same tokens and codes with lookahead
    on and off in both."""
    from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
    from omni.models.qwen3_omni.graph import build

    ckpt = str(make_tiny(tmp_path / "tiny-b", seed=2, preset="tiny-b"))
    _assert_lookahead_changes_nothing(build, ckpt, _speech_requests())


def test_a_subclass_that_changes_the_input_hooks_is_not_looked_ahead_of():
    from omni.models.qwen3_omni.modules.thinker import Qwen3OmniThinker
    from omni.stages.ar.lookahead import model_looks_ahead

    class HostIds(Qwen3OmniThinker):  # embeds the host's ids: its next input needs step N's ids on the host
        def input_embeds(self, seq, start, end):
            return None

    class SaysSoAgain(HostIds):
        lookahead_decode = True

    assert model_looks_ahead(Qwen3OmniThinker) and model_looks_ahead(TTSTalkerModel)
    assert not model_looks_ahead(HostIds) and model_looks_ahead(SaysSoAgain)


def test_qwen2_5_omni_speech_with_lookahead_equals_without(tmp_path):
    """Qwen2.5-Omni's talker keeps each code's embedding on the device (`after_sample`), so its next step
    can launch before the code reaches the host: the same tokens and codes with lookahead on and off,
    three requests at once, greedy and sampled, the talker waiting on the thinker's rows."""
    from omni.models.qwen2_5_omni.checkpoint.make_tiny import make_tiny
    from omni.models.qwen2_5_omni.graph import build

    ckpt = str(make_tiny(tmp_path / "tiny-b", seed=2, preset="tiny-b"))
    _assert_lookahead_changes_nothing(build, ckpt, _speech_requests(sampled_from=1), token2wav={"num_steps": 2})
