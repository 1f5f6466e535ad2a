"""The built-in AR engine against transformers: a tiny random Qwen3 LLM whose attention is
routed through omni's paged cache, compared token for token with its own `generate`."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from omni.kernel.errors import InvalidRequest  # noqa: E402
from omni.kernel.stage import StageContext  # noqa: E402
from omni.sampling import Sampling  # noqa: E402
from omni.stages.ar.block_manager import BlockManager  # noqa: E402
from omni.stages.ar.config import EngineConfig, EngineConfigError  # noqa: E402
from omni.stages.ar.engine import AREngine  # noqa: E402
from omni.stages.ar.sequence import SamplingParams, Sequence  # noqa: E402
from omni.stages.ar.stage import ARStage  # noqa: E402
from ar_engine_support import GREEDY, HFAdapter, make_engine, models, prompts, reference  # noqa: E402,F401 (fixtures)


# ---- block manager / config ------------------------------------------------------------
def test_block_manager_invariants():
    bm = BlockManager(num_blocks=6, block_size=4)
    a, b = Sequence("a", [1], SamplingParams()), Sequence("b", [1], SamplingParams())
    assert bm.blocks_needed(a, 9) == 3
    bm.allocate(a, 9)
    bm.allocate(a, 12)  # still 3 blocks
    assert len(a.block_table) == 3 and bm.num_free_blocks == 3
    assert not bm.can_allocate(b, 13) and bm.can_allocate(b, 12)
    bm.allocate(b, 12)
    assert set(a.block_table).isdisjoint(b.block_table) and bm.num_free_blocks == 0
    with pytest.raises(RuntimeError):
        bm.allocate(b, 13)
    assert bm.slot(b, 5) == b.block_table[1] * 4 + 1
    bm.free(a)
    assert a.block_table == [] and bm.num_free_blocks == 3
    bm.free(b)
    assert sorted(bm._free) == list(range(6))


def test_config_and_request_validation(models):
    with pytest.raises(EngineConfigError):
        EngineConfig(block_size=4, num_blocks=2, max_model_len=64)
    with pytest.raises(InvalidRequest):
        SamplingParams(top_p=0.0)
    eng = make_engine(models)
    with pytest.raises(InvalidRequest):
        eng.add_request("x", list(range(65)), GREEDY)
    with pytest.raises(InvalidRequest):
        eng.add_request("x", [], GREEDY)
    eng.add_request("x", [1, 2], GREEDY)
    with pytest.raises(InvalidRequest):
        eng.add_request("x", [1, 2], GREEDY)


# ---- parity with transformers ---------------------------------------------------------
def test_batched_greedy_matches_transformers(models, prompts, reference):
    eng = make_engine(models)
    assert eng.generate(prompts, GREEDY) == reference
    assert max(n for _, n in eng.model.batches) == len(prompts)  # really one batch
    stats = eng.stats()
    assert stats["free_blocks"] == stats["total_blocks"] and stats["running"] == stats["waiting"] == 0


def test_each_alone_matches_transformers(models, prompts, reference):
    eng = make_engine(models)
    for p, ref in zip(prompts, reference):
        assert eng.generate([p], GREEDY) == [ref]


def test_chunked_prefill_under_budget_matches(models, prompts, reference):
    eng = make_engine(models, max_num_batched_tokens=5)
    assert eng.generate(prompts, GREEDY) == reference
    assert max(t for t, _ in eng.model.batches) <= 5
    assert eng.model.batches[0] == (5, 1)  # the 5-token prompt alone fills the first step
    eng = make_engine(models, embeds=True, max_num_batched_tokens=7)  # embeddings path, chunked
    assert eng.generate(prompts, GREEDY) == reference


def test_continuous_batching_new_requests_join(models, prompts, reference):
    eng = make_engine(models)
    eng.add_request("r0", prompts[0], GREEDY)
    eng.step(), eng.step()
    eng.add_request("r1", prompts[1], GREEDY)
    outs = eng.step()
    assert {o.rid for o in outs} == {"r0", "r1"}  # r1 prefilled in the same step as r0 decodes
    assert eng.model.batches[-1] == (1 + len(prompts[1]), 2)
    tokens = {"r0": [], "r1": []}
    for o in outs:
        tokens[o.rid] += o.new_token_ids
    while eng.has_unfinished():
        for o in eng.step():
            tokens[o.rid] += o.new_token_ids
    assert tokens["r1"] == reference[1] and len(tokens["r0"]) == GREEDY.max_tokens - 2


def test_prefill_apart_from_decodes_gives_the_same_tokens(models, prompts, reference):
    """split_prefill (the default under decode graphs): r1's prompt gets a step of its own, r0 decodes
    in the next; every token is the same as transformers'."""
    eng = make_engine(models, split_prefill=True)
    eng.add_request("r0", prompts[0], GREEDY)
    eng.step(), eng.step()
    eng.add_request("r1", prompts[1], GREEDY)
    tokens = {"r0": [], "r1": []}
    steps = []
    while eng.has_unfinished():
        outs = eng.step()
        steps.append({o.rid for o in outs})
        for o in outs:
            tokens[o.rid] += o.new_token_ids
    assert steps[0] == {"r1"} and steps[1] == {"r0", "r1"}  # the prefill alone, then both decode
    assert tokens["r1"] == reference[1] and len(tokens["r0"]) == GREEDY.max_tokens - 2
    full = make_engine(models, split_prefill=True)
    assert full.generate(prompts, GREEDY) == reference


def test_preemption_when_blocks_run_out(models, prompts, reference):
    # 16 blocks of 4 = 64 slots: the batch needs ~140, so sequences are preempted and recomputed
    eng = make_engine(models, num_blocks=16)
    assert eng.generate(prompts, GREEDY) == reference
    assert eng.stats()["num_preemptions"] > 0
    assert eng.stats()["free_blocks"] == 16


def test_abort_frees_blocks_at_once(models, prompts):
    eng = make_engine(models)
    for i, p in enumerate(prompts[:3]):
        eng.add_request(f"r{i}", p, GREEDY)
    eng.step()
    before = eng.stats()
    assert before["running"] == 3 and before["free_blocks"] < before["total_blocks"]
    held = len(eng.seqs["r1"].block_table)
    assert eng.abort("r1") and not eng.abort("r1")
    after = eng.stats()
    assert after["free_blocks"] == before["free_blocks"] + held and after["running"] == 2
    assert eng.abort("r0") and eng.abort("r2")
    assert eng.stats()["free_blocks"] == eng.stats()["total_blocks"] and not eng.has_work()


def test_taps_match_transformers_hidden_states(models, prompts):
    ref, _ = models
    eng = make_engine(models, tap_layers=(0, 2, 3), max_num_batched_tokens=6, num_blocks=16)
    rows: dict[str, dict[int, list]] = {}
    seqs = [eng.add_request(f"r{i}", p, GREEDY, return_hidden=True) for i, p in enumerate(prompts[:4])]
    while eng.has_unfinished():
        for o in eng.step():
            if o.taps:
                got = rows.setdefault(o.rid, {t: [] for t in (0, 2, 3)})
                assert o.tap_start == sum(x.shape[0] for x in got[0])  # contiguous, no repeats
                for t, h in o.taps.items():
                    got[t].append(h)
    assert eng.stats()["num_preemptions"] > 0  # taps survive recompute without duplicates
    for seq in seqs:
        full = torch.tensor([seq.all_token_ids()[:-1]])  # the last sampled token is never fed
        with torch.no_grad():
            hs = ref.model(full, output_hidden_states=True).hidden_states
        for t in (0, 2, 3):
            torch.testing.assert_close(torch.cat(rows[seq.rid][t]), hs[t][0], atol=1e-4, rtol=1e-4)


# ---- sampling ---------------------------------------------------------------------------
def test_sampling_support_and_seed(models, prompts, reference):
    eng = make_engine(models)
    top = SamplingParams(temperature=1.5, top_k=3, seed=7, max_tokens=1)
    first = eng.generate([prompts[0]] * 4, top)
    again = eng.generate([prompts[0]] * 4, top)
    assert first == again  # seeded: reproducible and independent of the batch
    with torch.no_grad():
        logits = models[0](torch.tensor([prompts[0]])).logits[0, -1]
    top3 = set(torch.topk(logits, 3).indices.tolist())
    draws = {eng.generate([prompts[0]], SamplingParams(temperature=2.0, top_k=3, seed=s, max_tokens=1))[0][0] for s in range(40)}
    assert draws <= top3 and len(draws) > 1
    probs = logits.softmax(-1)
    nucleus = set(torch.argsort(probs, descending=True)[: int((probs.sort(descending=True).values.cumsum(0) < 0.6).sum()) + 1].tolist())
    draws = {eng.generate([prompts[0]], SamplingParams(temperature=1.0, top_p=0.6, seed=s, max_tokens=1))[0][0] for s in range(40)}
    assert draws <= nucleus
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=6)
    alone = eng.generate([prompts[1]], seeded)[0]
    mixed = eng.generate([prompts[0], prompts[1], prompts[2]], [SamplingParams(temperature=3.0, max_tokens=6), seeded, GREEDY])
    assert mixed[1] == alone  # a seeded request does not depend on its batch
    assert mixed[2] == reference[2]  # greedy rows stay greedy beside sampled ones
    unseeded = {tuple(eng.generate([prompts[0]], SamplingParams(temperature=5.0, max_tokens=4))[0]) for _ in range(6)}
    assert len(unseeded) > 1


def test_repetition_penalty_matches_transformers(models, prompts):
    ref, _ = models
    eng = make_engine(models)
    p = prompts[3]
    got = eng.generate([p], SamplingParams(temperature=0.0, repetition_penalty=1.8, max_tokens=12))[0]
    with torch.no_grad():
        want = ref.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), max_new_tokens=12, do_sample=False, repetition_penalty=1.8, eos_token_id=None, pad_token_id=0)
    assert got == want[0, len(p) :].tolist()
    # output-only penalty, as transformers applies it when generating from inputs_embeds
    got = eng.generate([p], SamplingParams(temperature=0.0, repetition_penalty=1.8, max_tokens=12, penalty_includes_prompt=False))[0]
    with torch.no_grad():
        embeds = ref.model.embed_tokens(torch.tensor([p]))
        want = ref.generate(inputs_embeds=embeds, attention_mask=torch.ones(1, len(p), dtype=torch.long), max_new_tokens=12,
                            do_sample=False, repetition_penalty=1.8, eos_token_id=None, pad_token_id=0)
    assert got == want[0].tolist()
    assert got != eng.generate([p], SamplingParams(temperature=0.0, repetition_penalty=1.8, max_tokens=12))[0]


def test_stop_ids_max_tokens_and_eos(models, prompts, reference):
    ref_out = reference[2]
    eos = next(t for t in ref_out[2:] if t not in ref_out[:2])
    eng = make_engine(models, eos_token_ids=(eos,))
    stop_at = ref_out.index(eos)
    outs = []
    eng.add_request("eos", prompts[2], GREEDY)
    eng.add_request("ign", prompts[2], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    eng.add_request("stop", prompts[2], SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=(ref_out[1],), ignore_eos=True))
    eng.add_request("len", prompts[2], SamplingParams(temperature=0.0, max_tokens=2))
    done = {}
    while eng.has_unfinished():
        for o in eng.step():
            outs.append(o)
            if o.finished:
                done[o.rid] = o.finish_reason
    toks = {rid: [t for o in outs if o.rid == rid for t in o.new_token_ids] for rid in done}
    assert toks["eos"] == ref_out[: stop_at + 1] and done["eos"] == "stop"
    assert toks["ign"] == ref_out and done["ign"] == "length"
    assert toks["stop"] == ref_out[: ref_out.index(ref_out[1]) + 1] and done["stop"] == "stop"
    assert toks["len"] == ref_out[:2] and done["len"] == "length"


# ---- hooks --------------------------------------------------------------------------------
class ParkingAdapter(HFAdapter):
    """Parks each sequence after every sampled token until `release_all` (like the talker)."""

    def __init__(self, hf):
        super().__init__(hf)
        self.parked: set[str] = set()

    def input_ready(self, seq):
        return seq.rid not in self.parked

    def after_sample(self, seqs, token_ids, hidden):
        self.parked.update(s.rid for s in seqs)
        return [{"hidden_norm": float(h.norm())} for h in hidden]


def test_parked_sequences_wait_for_input(models, prompts, reference):
    model = ParkingAdapter(models[1])
    eng = AREngine(model, EngineConfig(block_size=4, num_blocks=64, max_model_len=64))
    eng.add_request("a", prompts[0], GREEDY)
    eng.add_request("b", prompts[1], GREEDY)
    tokens = {"a": [], "b": []}
    steps = 0
    while eng.has_unfinished():
        outs = eng.step()
        if not outs:
            assert not eng.has_work() and eng.stats()["running"] == 2
            model.parked.clear()
            continue
        steps += 1
        for o in outs:
            tokens[o.rid] += o.new_token_ids
            assert o.extra and o.extra["hidden_norm"] > 0
    assert tokens == {"a": reference[0], "b": reference[1]} and steps == GREEDY.max_tokens


# ---- stage adapter ------------------------------------------------------------------------
def test_ar_stage_emits_tokens_hidden_and_finish(models, prompts, reference):
    ctx = StageContext(
        name="llm",
        args={"model_factory": lambda ctx: HFAdapter(models[1]), "block_size": 4, "num_blocks": 64,
              "max_model_len": 64, "tap_layers": [0, 2], "max_num_batched_tokens": 3},
        in_ports=["tokens"], out_ports=["text", "hidden"],
    )
    stage = ARStage(ctx)
    stage.setup()
    stage.open("a", {"sampling": {"llm": {"temperature": 0.0, "max_tokens": 12}}})
    stage.feed("a", "tokens", {"token_ids": prompts[0][:2]})
    stage.feed("a", "tokens", {"token_ids": prompts[0][2:]})
    assert not stage.has_work()
    stage.close_input("a")
    stage.open("bad", {"sampling": {"llm": {"temperature": -1}}})
    stage.close_input("bad")
    stage.open("gone", {"sampling": {"llm": {"temperature": 0.0, "max_tokens": 12}}})
    stage.feed("gone", "tokens", {"token_ids": prompts[1]})
    stage.close_input("gone")
    tokens, hidden, finished, errors = [], [], [], []
    first = True
    while stage.has_work():
        emits = stage.step()
        if first:
            stage.abort("gone")
            first = False
        for e in emits:
            if e.error:
                errors.append((e.rid, e.error_kind))
            elif e.finish:
                finished.append(e.rid)
            elif e.port == "text" and e.rid == "a":
                tokens += e.data["token_ids"]
            elif e.port == "hidden" and e.rid == "a":
                assert e.data["layer_0"].shape == e.data["layer_2"].shape == (len(e.data["token_ids"]), 64)
                hidden.append((e.data["tap_start"], e.data["token_ids"], e.data["prompt_len"]))
    assert tokens == reference[0] and finished == ["a"] and errors == [("bad", "invalid_request")]
    # the 5-token prompt was prefilled in chunks of <= 3 but its rows arrive as one chunk
    assert hidden[0] == (0, prompts[0], len(prompts[0]))
    assert [h[1] for h in hidden[1:]] == [[t] for t in reference[0][:-1]]
    assert [h[0] for h in hidden[1:]] == list(range(len(prompts[0]), len(prompts[0]) + len(reference[0]) - 1))
    assert stage.stats()["free_blocks"] == 64


def test_ar_stage_sampling_from_params(models):
    """A stage reads the sampling set for its own name (typed, as the bus carries it, or plain
    dicts in-process) over its defaults; top-level keys and other stages' tables are not its own."""
    stage = ARStage(StageContext(name="thinker", args={"model_factory": lambda ctx: HFAdapter(models[1]),
                                                      "default_sampling": {"max_tokens": 3, "top_k": 5}}))
    sp = stage.sampling_params({"temperature": 9.0, "sampling": {"thinker": {"temperature": 0.0}, "talker": {"top_k": 1}}})
    assert (sp.temperature, sp.top_k, sp.max_tokens) == (0.0, 5, 3)
    typed = stage.sampling_params({"sampling": {"thinker": Sampling(seed=3, logit_bias={7: 1.5})}})
    assert (typed.seed, typed.logit_bias, typed.max_tokens) == (3, ((7, 1.5),), 3)
    assert ARStage(StageContext(name="y")).sampling_params({"temperature": 0.5}).temperature == 1.0
    with pytest.raises(InvalidRequest, match="temperature"):
        stage.sampling_params({"sampling": {"thinker": {"temperature": -1}}})


def test_no_work_while_parked_sequences_hold_the_blocks(models, prompts, reference):
    model = ParkingAdapter(models[1])
    eng = AREngine(model, EngineConfig(block_size=4, num_blocks=16, max_model_len=64))
    eng.add_request("a", prompts[3], GREEDY)  # 17 tokens: 5 blocks
    eng.add_request("b", prompts[6], GREEDY)  # 13 tokens: 4 blocks
    eng.step()
    eng.add_request("c", list(range(40)), GREEDY)  # needs 10 blocks, 7 are free
    assert not eng.has_work() and eng.step() == []  # nothing to do: the actor may sleep
    tokens = {"a": [], "b": [], "c": []}
    while eng.has_unfinished():
        if not eng.has_work():
            model.parked.clear()
        for o in eng.step():
            tokens[o.rid] += o.new_token_ids
    assert tokens["a"] == reference[3][1:] and tokens["b"] == reference[6][1:] and len(tokens["c"]) == GREEDY.max_tokens


# ---- isolation --------------------------------------------------------------------------
def test_blocks_left_poisoned_never_reach_another_request(models, prompts, reference):
    """Every KV slot holds NaN/inf, as a poisoned request leaves its freed blocks: a slot is only
    read once written by its owner, so outputs match transformers (0 * NaN would spread NaN)."""
    eng = make_engine(models)
    eng.kv_cache[..., 0::2].fill_(float("nan"))
    eng.kv_cache[..., 1::2].fill_(float("inf"))
    assert eng.generate(prompts, GREEDY) == reference  # batched: ragged lengths, padded tables
    for p, ref in zip(prompts[:3], reference):
        assert eng.generate([p], GREEDY) == [ref]


def test_the_kv_cache_is_sized_per_slot_on_cuda_unless_given():
    """256 blocks (4,096 tokens) for every stream together made 64 streams on one H200 queue for KV while
    slots and GPU idled; on CUDA each slot now gets KV_TOKENS_PER_SEQ tokens unless num_blocks is set."""
    from omni.stages.ar.config import CPU_NUM_BLOCKS, KV_TOKENS_PER_SEQ

    assert EngineConfig().num_blocks == CPU_NUM_BLOCKS  # the CPU keeps its small default
    assert EngineConfig(device="cuda:0", max_num_seqs=64, block_size=16).num_blocks == 64 * KV_TOKENS_PER_SEQ // 16
    assert EngineConfig(device="cuda", num_blocks=300).num_blocks == 300  # a given size stays
    assert EngineConfig(max_model_len=8192, block_size=16).num_blocks == 512  # always one longest sequence
    with pytest.raises(EngineConfigError):
        EngineConfig(num_blocks=10, max_model_len=8192)
