"""The streaming talker against transformers' Qwen3-Omni `generate` (greedy codes, all groups).

transformers is the oracle: its `generate(..., return_audio=True, talker_do_sample=False)`
runs thinker then talker; we capture the thinker's per-token states (layer 0 and layer
`accept_hidden_layer`) and the codes it hands to code2wav, then stream those states into
omni's `TalkerStage` in chunks and require the very same codes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from kernel_helpers import unbatched
from omni.kernel.stage import StageContext
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.modules.talker import TalkerModel
from omni.models.qwen3_omni.stages.talker_stage import TalkerStage
from omni.layers.tokenizer_offline import token_ids

transformers = pytest.importorskip("transformers")

IDS = token_ids()
IM_START, IM_END, NL = IDS["<|im_start|>"], IDS["<|im_end|>"], 10


def chat(user: str | list[int], system: str = "be brief", audio_tokens: int = 0) -> list[int]:
    audio = [IDS["<|audio_start|>"]] + [IDS["<|audio_pad|>"]] * audio_tokens + [IDS["<|audio_end|>"]] if audio_tokens else []
    user_ids = list(user.encode()) if isinstance(user, str) else user
    return (
        [IM_START, IDS["system"], NL] + list(system.encode()) + [IM_END, NL]
        + [IM_START, IDS["user"], NL] + audio + user_ids + [IM_END, NL]
        + [IM_START, IDS["assistant"], NL]
    )


@dataclass
class Reference:
    prompt: list[int]
    embed: torch.Tensor  # [rows, thinker H] layer 0 of every computed thinker token
    hidden: torch.Tensor  # [rows, thinker H] layer accept_hidden_layer
    codes: np.ndarray  # [frames, groups] what transformers handed to code2wav
    speaker: str
    max_tokens: int
    talker_tokens: list[int]
    thinker_stopped: bool  # the thinker sampled its EOS (which never gets a row)


class Oracle:
    """A tiny checkpoint loaded in transformers, and references captured from its generate."""

    def __init__(self, ckpt_dir: str) -> None:
        from transformers import Qwen3OmniMoeForConditionalGeneration

        self.dir = ckpt_dir
        self.hf = Qwen3OmniMoeForConditionalGeneration.from_pretrained(ckpt_dir).eval()
        self.accept = self.hf.config.talker_config.accept_hidden_layer
        self._captured: dict = {}
        for name in ("thinker", "talker"):
            self._wrap_generate(getattr(self.hf, name), name)
        c2w = self.hf.code2wav
        original = c2w.forward
        c2w.forward = lambda codes, **kw: (self._captured.__setitem__("codes", codes.clone()), original(codes, **kw))[1]

    def _wrap_generate(self, module, name: str) -> None:
        original = module.generate

        def generate(*args, **kwargs):
            result = original(*args, **kwargs)
            self._captured[name] = result
            return result

        module.generate = generate

    def reference(self, prompt, thinker_tokens, max_tokens, speaker="Ethan", audio_frames=0, thinker_eos=IM_END,
                  **extra):
        self._captured.clear()
        if audio_frames:
            g = torch.Generator().manual_seed(len(prompt))
            extra["input_features"] = torch.randn(1, 128, audio_frames, generator=g)
            extra["feature_attention_mask"] = torch.ones(1, audio_frames, dtype=torch.long)
        self.hf.generate(
            torch.tensor([prompt]), speaker=speaker, return_audio=True, thinker_max_new_tokens=thinker_tokens,
            thinker_eos_token_id=thinker_eos, thinker_do_sample=False, talker_max_new_tokens=max_tokens,
            talker_do_sample=False, **extra,
        )
        states = self._captured["thinker"].hidden_states
        generated = self._captured["thinker"].sequences[0, len(prompt):].tolist()
        return Reference(
            prompt=prompt,
            embed=torch.cat([s[0] for s in states], 1)[0],
            hidden=torch.cat([s[self.accept] for s in states], 1)[0],
            codes=self._captured["codes"][0].T.numpy(),
            speaker=speaker,
            max_tokens=max_tokens,
            talker_tokens=self._captured["talker"].sequences[0].tolist(),
            thinker_stopped=generated[-1] == thinker_eos,
        )

    def thinker_tokens(self, prompt, n: int) -> list[int]:
        out = self.hf.thinker.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=IM_END)
        return out[0, len(prompt):].tolist()


def make_stage(model: TalkerModel, **args) -> TalkerStage:
    stage = TalkerStage(StageContext("talker", args={"model": model, "num_blocks": 96, "block_size": 8,
                                                        "max_model_len": 512, **args}))
    stage.setup()
    return stage


def open_ref(stage: TalkerStage, rid: str, ref: Reference, **params) -> None:
    sampling = {"temperature": 0, "max_tokens": ref.max_tokens}
    stage.open(rid, {"speaker": ref.speaker, "sampling": {"talker": sampling}, **params})


def collect(emits, out: dict, done: set) -> None:
    for e in unbatched(emits):
        assert e.error is None, e.error
        if e.data is not None:
            assert e.port == "codes"
            out.setdefault(e.rid, []).append(e.data["codes"])
        if e.finish:
            done.add(e.rid)


def codes_of(frames) -> np.ndarray:
    return np.concatenate(frames) if frames else np.zeros((0, 0), dtype=np.int64)


def init_talker_experts(ckpt_dir, seed: int = 0, std: float = 0.3) -> None:
    """transformers never initialises the talker's routed experts (`torch.empty`), so a fresh
    tiny checkpoint holds whatever memory held: refill them from a seeded generator."""
    from safetensors.torch import load_file, save_file

    path = f"{ckpt_dir}/model.safetensors"
    tensors = load_file(path)
    gen = torch.Generator().manual_seed(seed)
    for name in sorted(tensors):
        if name.startswith("talker.model.layers.") and ".mlp.experts." in name:
            tensors[name] = torch.randn(tensors[name].shape, generator=gen) * std
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.fixture(scope="module", params=["tiny-b", "tiny-c"])
def oracle(request, tmp_path_factory):
    path = make_tiny(tmp_path_factory.mktemp(request.param), seed=0, preset=request.param)
    init_talker_experts(path)
    return Oracle(str(path))


@pytest.fixture(scope="module")
def refs(oracle):
    """References that end every way: talker EOS, talker max_tokens, thinker EOS, thinker length."""
    prompt = chat("hello there, how are you?")
    # Any token the thinker emits can serve as its EOS: pick its 6th so that it stops early.
    stop = oracle.thinker_tokens(prompt, 6)[-1]
    return [
        oracle.reference(chat("what?"), thinker_tokens=12, max_tokens=40),
        oracle.reference(chat("hi"), thinker_tokens=12, max_tokens=30, speaker="Chelsie"),
        oracle.reference(chat("tell me a story", system="you are a bard"), thinker_tokens=6, max_tokens=25,
                         speaker="aiden"),
        oracle.reference(prompt, thinker_tokens=30, max_tokens=40, thinker_eos=stop, speaker="aiden"),
    ]


@pytest.fixture(scope="module")
def model(oracle):
    return TalkerModel.from_checkpoint(oracle.dir)


def run_streamed(stage: TalkerStage, ref: Reference, chunk: int, lazy: bool, rid: str = "r",
                 opened: bool = False) -> np.ndarray:
    """Feed the prompt rows, then `chunk` generated rows at a time; with `lazy`, only when
    the talker is blocked on the thinker (it never steps ahead of what it has)."""
    if not opened:
        open_ref(stage, rid, ref)
    p = len(ref.prompt)
    stage.feed(rid, "hidden", {"embed": ref.embed[:p], "hidden": ref.hidden[:p], "token_ids": ref.prompt})
    out, done, fed, closed = {}, set(), p, False
    for _ in range(10_000):
        if rid in done:
            break
        if not closed and (not lazy or not stage.has_work()):
            if fed < len(ref.embed):
                n = min(chunk, len(ref.embed) - fed)
                stage.feed(rid, "hidden", {"embed": ref.embed[fed:fed + n], "hidden": ref.hidden[fed:fed + n],
                                           "token_ids": [0] * n})
                fed += n
            else:
                stage.close_input(rid)
                closed = True
        collect(stage.step(), out, done)
    assert rid in done
    return codes_of(out.get(rid, []))


@pytest.mark.parametrize("chunk,lazy", [(1, True), (1, False), (5, False), (10_000, False)])
def test_streamed_codes_equal_transformers(oracle, refs, model, chunk, lazy):
    for ref in refs:
        stage = make_stage(model)
        got = run_streamed(stage, ref, chunk, lazy)
        assert got.shape == ref.codes.shape and (got == ref.codes).all(), (got[:, 0], ref.codes[:, 0])
        assert stage.engine.scheduler.blocks.num_free_blocks == stage.engine.config.num_blocks


def test_references_cover_each_ending(oracle, refs):
    """The parity cases must include every way a talker or thinker stream ends."""
    eos = oracle.hf.config.talker_config.codec_eos_token_id
    assert {"eos" if r.talker_tokens[-1] == eos else "length" for r in refs} == {"eos", "length"}
    assert {r.thinker_stopped for r in refs} == {True, False}
    for r in refs:
        assert r.codes.shape[0] == len(r.talker_tokens) - 1  # the last token never gets a frame
        assert r.codes.shape[0] > 2


def test_talker_blocks_until_thinker_row_arrives(refs, model):
    ref = refs[0]
    stage = make_stage(model)
    open_ref(stage, "r", ref)
    p = len(ref.prompt)
    stage.feed("r", "hidden", {"embed": ref.embed[:p], "hidden": ref.hidden[:p], "token_ids": ref.prompt})
    assert not stage.has_work()  # the first generated token's row is not there yet
    stage.feed("r", "hidden", {"embed": ref.embed[p:p + 2], "hidden": ref.hidden[p:p + 2], "token_ids": [0, 0]})
    out, done = {}, set()
    while stage.has_work():
        collect(stage.step(), out, done)
    # prefill with row p, then one frame per trailing row (row p+1) and one more that waits
    assert len(out["r"]) == 2 and not done
    assert stage.engine.stats()["running"] == 1


def run_concurrently(stage: TalkerStage, cases: list[Reference]) -> dict:
    """All requests at once; request i gets one thinker row every (i % 3 + 1) steps."""
    fed = {}
    for i, ref in enumerate(cases):
        open_ref(stage, f"r{i}", ref)
        p = len(ref.prompt)
        stage.feed(f"r{i}", "hidden", {"embed": ref.embed[:p], "hidden": ref.hidden[:p], "token_ids": ref.prompt})
        fed[i] = p
    out, done, closed = {}, set(), set()
    for step in range(10_000):
        if len(done) == len(cases):
            break
        for i, ref in enumerate(cases):
            if i in closed or step % (i % 3 + 1):
                continue
            if fed[i] < len(ref.embed):
                s = fed[i]
                stage.feed(f"r{i}", "hidden", {"embed": ref.embed[s:s + 1], "hidden": ref.hidden[s:s + 1],
                                               "token_ids": [0]})
                fed[i] += 1
            else:
                stage.close_input(f"r{i}")
                closed.add(i)
        collect(stage.step(), out, done)
    assert len(done) == len(cases)
    return {i: codes_of(out.get(f"r{i}", [])) for i in range(len(cases))}


def test_eight_concurrent_requests_match_alone(oracle, refs, model):
    cases = refs + [
        oracle.reference(chat(f"question number {i}"), thinker_tokens=6 + 2 * i, max_tokens=20 + 3 * i,
                         speaker=("Ethan", "Chelsie", "Aiden")[i % 3])
        for i in range(4)
    ]
    assert len(cases) == 8
    stage = make_stage(model)
    got = run_concurrently(stage, cases)
    assert stage.engine.stats()["num_steps"] < sum(len(r.codes) + 1 for r in cases)  # it did batch
    for i, ref in enumerate(cases):
        assert got[i].shape == ref.codes.shape and (got[i] == ref.codes).all(), i


def test_preempted_requests_recompute_the_same_codes(refs, model):
    """A KV cache too small for all requests: the engine preempts and recomputes from the
    stored prefill, frame and trailing rows."""
    stage = make_stage(model, num_blocks=10, block_size=8, max_model_len=80)
    got = run_concurrently(stage, refs)
    assert stage.engine.stats()["num_preemptions"] > 0
    for i, ref in enumerate(refs):
        assert got[i].shape == ref.codes.shape and (got[i] == ref.codes).all(), i
    assert stage.engine.scheduler.blocks.num_free_blocks == 10


def test_prompt_in_chunks_as_engine_taps(refs, model, oracle):
    """The engine's tap format, the prompt split across chunks, its ids in the request params."""
    ref = refs[1]
    stage = make_stage(model)
    open_ref(stage, "r", ref, prompt_token_ids=ref.prompt)
    acc = oracle.accept
    out, done = {}, set()
    bounds = [0, 7, len(ref.prompt), len(ref.prompt) + 3, len(ref.embed)]
    for lo, hi in zip(bounds, bounds[1:]):
        stage.feed("r", "hidden", {"tap_start": lo, "layer_0": ref.embed[lo:hi].numpy(),
                                   f"layer_{acc}": ref.hidden[lo:hi].numpy()})
        collect(stage.step(), out, done)
    stage.close_input("r")
    while "r" not in done:
        collect(stage.step(), out, done)
    got = codes_of(out["r"])
    assert got.shape == ref.codes.shape and (got == ref.codes).all()


def test_audio_prompt_uses_hidden_projection(oracle, model):
    """Audio placeholders in the user turn take the thinker's deep hidden state."""
    frames = 100
    n_audio = 13  # transformers' encoder output length for 100 feature frames
    ref = oracle.reference(chat("what is this sound", audio_tokens=n_audio), thinker_tokens=8, max_tokens=20,
                           audio_frames=frames)
    got = run_streamed(make_stage(model), ref, chunk=2, lazy=False)
    assert got.shape == ref.codes.shape and (got == ref.codes).all()


def test_vision_prompt_uses_mrope_positions(oracle, model):
    """Image / video placeholders in the user turn: the talker's prefill takes 3-D M-RoPE
    positions from the vision grids (sent on their own edge), decode positions index + delta."""
    g = torch.Generator().manual_seed(1)
    patch = 3 * 2 * 16 * 16
    image_grid, video_grid = [1, 4, 4], [2, 4, 4]  # 4 and 8 placeholder tokens after the 2x2 merge
    vision = lambda tok, n: [IDS["<|vision_start|>"]] + [IDS[tok]] * n + [IDS["<|vision_end|>"]]  # noqa: E731
    prompt = chat(list(b"look ") + vision("<|image_pad|>", 4) + list(b" watch") + vision("<|video_pad|>", 8))
    ref = oracle.reference(
        prompt, thinker_tokens=10, max_tokens=30, pixel_values=torch.randn(16, patch, generator=g),
        image_grid_thw=torch.tensor([image_grid]), pixel_values_videos=torch.randn(32, patch, generator=g),
        video_grid_thw=torch.tensor([video_grid]), video_second_per_grid=torch.tensor([0.5]),
    )
    assert oracle.hf.talker.rope_deltas.item() != 0  # transformers did use 3-D positions
    stage = make_stage(model)
    open_ref(stage, "r", ref)
    stage.feed("r", "vision", {"image_grid_thw": np.array([image_grid]), "video_grid_thw": [video_grid],
                               "video_second_per_grid": [0.5]})
    got = run_streamed(stage, ref, chunk=3, lazy=False, opened=True)
    assert got.shape == ref.codes.shape and (got == ref.codes).all()
    # Without the grids the prefill cannot be built: the request fails when the thinker ends.
    stage = make_stage(model)
    open_ref(stage, "r", ref, prompt_token_ids=ref.prompt)
    stage.feed("r", "hidden", {"embed": ref.embed, "hidden": ref.hidden})
    assert not stage.has_work()
    stage.close_input("r")
    assert [e.error_kind for e in stage.step()] == ["invalid_request"]


def test_abort_mid_stream_frees_kv_blocks(refs, model):
    ref = refs[1]
    stage = make_stage(model)
    total = stage.engine.config.num_blocks
    for rid in ("a", "b"):
        open_ref(stage, rid, ref, prompt_token_ids=ref.prompt)
        stage.feed(rid, "hidden", {"embed": ref.embed, "hidden": ref.hidden})
    out, done = {}, set()
    for _ in range(4):
        collect(stage.step(), out, done)
    assert len(out["a"]) == 4 and stage.engine.scheduler.blocks.num_free_blocks < total
    stage.abort("a")
    stage.abort("b")
    assert stage.engine.scheduler.blocks.num_free_blocks == total
    assert stage.step() == [] and not stage.has_work()
    stage.feed("a", "hidden", {"embed": ref.embed[:1], "hidden": ref.hidden[:1]})  # late chunk: ignored
    assert stage.step() == []


def test_thinker_ending_before_first_token_finishes_without_codes(refs, model):
    ref = refs[0]
    stage = make_stage(model)
    open_ref(stage, "r", ref)
    p = len(ref.prompt)
    stage.feed("r", "hidden", {"embed": ref.embed[:p], "hidden": ref.hidden[:p], "token_ids": ref.prompt})
    stage.close_input("r")
    emits = stage.step()
    assert [(e.rid, e.finish, e.data) for e in emits] == [("r", True, None)]


def test_bad_requests_fail_with_typed_errors(refs, model):
    ref = refs[0]
    stage = make_stage(model)
    stage.open("voice", {"speaker": "nobody"})
    stage.open("noassistant", {})
    stage.feed("noassistant", "hidden", {"embed": ref.embed[:5], "hidden": ref.hidden[:5], "token_ids": [1, 2, 3, 4, 5]})
    stage.open("rows", {})
    stage.feed("rows", "hidden", {"embed": ref.embed[:5], "hidden": ref.hidden[:4], "token_ids": ref.prompt})
    errors = {e.rid: e.error_kind for e in stage.step() if e.error}
    assert errors == {"voice": "invalid_request", "noassistant": "invalid_request", "rows": "invalid_request"}


def test_sampling_is_seeded_and_stays_in_the_codebook(oracle, refs, model):
    ref = refs[1]
    codebook = oracle.hf.config.code2wav_config.codebook_size
    eos = oracle.hf.config.talker_config.codec_eos_token_id

    def run(seed):
        stage = make_stage(model)
        sampling = {"temperature": 0.9, "top_k": 50, "seed": seed, "max_tokens": 25}
        stage.open("s", {"speaker": "ethan", "sampling": {"talker": sampling}, "prompt_token_ids": ref.prompt})
        stage.feed("s", "hidden", {"embed": ref.embed, "hidden": ref.hidden})
        stage.close_input("s")
        out, done = {}, set()
        while "s" not in done:
            collect(stage.step(), out, done)
        return codes_of(out.get("s", []))

    a, b, c = run(7), run(7), run(8)
    assert (a == b).all() and a.shape[1] == oracle.hf.config.talker_config.num_code_groups
    assert a.min() >= 0 and a.max() < codebook and eos not in a[:, 0]
    assert a.shape != c.shape or (a != c).any()


def test_fed_live_by_the_thinker_stage(oracle, refs, model):
    """ThinkerStage and TalkerStage stepped in turn, the thinker's `hidden` chunks fed as they come;
    the same request again is served from both prefix caches (the thinker's taps of its cached
    positions from its tap store) and gives the same codes."""
    from omni.models.qwen3_omni.stages.thinker_stage import ThinkerStage

    ref = refs[0]
    thinker = ThinkerStage(StageContext("thinker", args={"model_dir": oracle.dir, "block_size": 8, "num_blocks": 32,
                                                         "max_model_len": 256}, out_ports=["text", "hidden"]))
    thinker.setup()
    talker = make_stage(model)
    params = {"prompt_token_ids": ref.prompt, "speaker": ref.speaker,
              "sampling": {"thinker": {"temperature": 0, "max_tokens": len(ref.embed) - len(ref.prompt) + 1},
                           "talker": {"temperature": 0, "max_tokens": ref.max_tokens}}}
    for rid in ("r", "again"):
        thinker.open(rid, params)
        talker.open(rid, params)
        out, done = {}, set()
        while rid not in done:
            for e in thinker.step():
                assert e.error is None
                if e.port == "hidden":
                    talker.feed(rid, "hidden", e.data)
                if e.finish:
                    talker.close_input(rid)
            collect(talker.step(), out, done)
        got = codes_of(out[rid])
        assert got.shape == ref.codes.shape and (got == ref.codes).all(), rid
    assert thinker.stats()["prefix_cache_hit_tokens"] == (len(ref.prompt) - 1) // 8 * 8
    assert talker.stats()["prefix_cache_hit_tokens"] > 0


@pytest.mark.gpu
def test_talker_on_cuda_matches_transformers(oracle, refs):
    model = TalkerModel.from_checkpoint(oracle.dir, device="cuda")
    got = run_concurrently(make_stage(model, device="cuda"), refs)
    if not model.router_ties():  # tied router rows: a top-k tie CUDA breaks otherwise than CPU, so codes
        for i, ref in enumerate(refs):  # differ by device by design (test_talker_device_paths fills the router)
            assert got[i].shape == ref.codes.shape and (got[i] == ref.codes).all(), i
    bf16 = TalkerModel.from_checkpoint(oracle.dir, device="cuda", dtype=torch.bfloat16)
    got = run_concurrently(make_stage(bf16, device="cuda"), refs)
    codebook = oracle.hf.config.code2wav_config.codebook_size
    assert all(len(g) > 0 and g.min() >= 0 and g.max() < codebook for g in got.values())


def test_prefix_cache_reuses_user_turns_and_never_mixes_inputs(refs, model):
    """The user part of the talker's prefill is cached by the thinker rows it came from: the same
    rows again hit (same codes); a changed row misses from its block on (codes of a cache-off run)."""
    ref = refs[3]
    stage = make_stage(model, block_size=4, num_blocks=192)
    first = run_streamed(stage, ref, 10_000, False, rid="a")
    assert (first == ref.codes).all()
    stats = stage.engine.stats()
    assert stats["prefix_cache_hit_tokens"] == 0
    again = run_streamed(stage, ref, 10_000, False, rid="b")
    hits = stage.engine.stats()["prefix_cache_hit_tokens"]
    assert (again == ref.codes).all() and hits == 28  # 30 user rows: 7 full blocks; the assistant part is never cached
    changed = Reference(**{**ref.__dict__, "embed": ref.embed.clone()})
    changed.embed[30] += 0.5  # the thinker row behind the talker's user row 17 (block 4)
    got = run_streamed(stage, changed, 10_000, False, rid="c")
    assert stage.engine.stats()["prefix_cache_hit_tokens"] - hits == 16
    want = run_streamed(make_stage(model, block_size=4, num_blocks=192, enable_prefix_caching=False), changed, 10_000, False)
    assert (got == want).all()
    assert stage.engine.scheduler.blocks.num_free_blocks == 192
    stage.engine.scheduler.blocks.check()
