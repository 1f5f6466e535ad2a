"""The built-in AR engine against transformers: a tiny random Qwen3 LLM whose attention is
routed through omni's paged cache, compared token for token with its own `generate`."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from omni.kernel.errors import InvalidRequest  # noqa: E402
from omni.kernel.stage import StageContext  # noqa: E402
from omni.sampling import Sampling  # noqa: E402
from omni.stages.ar.block_manager import BlockManager  # noqa: E402
from omni.stages.ar.config import EngineConfig, EngineConfigError  # noqa: E402
from omni.stages.ar.engine import AREngine  # noqa: E402
from omni.stages.ar.model_api import ARModel, ForwardOutput, KVCacheSpec  # noqa: E402
from omni.stages.ar.sequence import SamplingParams, Sequence  # noqa: E402
from omni.stages.ar.stage import ARStage  # noqa: E402

VOCAB = 96
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
_current: dict = {}


def _paged_attention(module, q, k, v, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention interface -> omni's paged attention (batch of one flat sequence)."""
    out = _current["batch"].attend(module.layer_idx, q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), scaling)
    return out[None], None


transformers.AttentionInterface.register("omni_paged_test", _paged_attention)


class HFAdapter(ARModel):
    """A transformers causal LM run by the engine: its own layers, omni's KV cache."""

    def __init__(self, hf, embeds: bool = False) -> None:
        self.hf = hf
        self.embeds = embeds  # exercise the input-embeddings path
        self.batches: list[tuple[int, int]] = []  # (tokens, sequences) per step

    def kv_cache_spec(self) -> KVCacheSpec:
        c = self.hf.config
        return KVCacheSpec(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, torch.float32, c.vocab_size)

    def embed_tokens(self, input_ids):
        return self.hf.model.embed_tokens(input_ids)

    def prefix_key(self, seq, start, end):
        return b""  # the embeddings path feeds the token embeddings: token ids decide the KV

    def input_embeds(self, seq, start, end):
        if not self.embeds:
            return None
        return self.hf.model.embed_tokens(torch.tensor(seq.token_ids(start, end))) * 1.0

    def forward(self, batch):
        self.batches.append((batch.num_tokens, len(batch.spans)))
        _current["batch"] = batch
        kwargs = {"inputs_embeds": batch.inputs_embeds[None]} if batch.inputs_embeds is not None else {
            "input_ids": batch.input_ids[None]
        }
        out = self.hf.model(position_ids=batch.positions[None], use_cache=False, output_hidden_states=bool(batch.tap_layers), **kwargs)
        taps = {t: out.hidden_states[t][0] for t in batch.tap_layers}
        return ForwardOutput(out.last_hidden_state[0], taps)

    def compute_logits(self, hidden):
        return self.hf.lm_head(hidden)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, initializer_range=0.3, max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    ref = transformers.Qwen3ForCausalLM(copy.deepcopy(cfg)).eval()
    ref.set_attn_implementation("sdpa")
    paged = transformers.Qwen3ForCausalLM(copy.deepcopy(cfg)).eval()
    paged.load_state_dict(ref.state_dict())
    paged.set_attn_implementation("omni_paged_test")
    return ref, paged


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (5, 11, 3, 17, 8, 2, 13, 6)]


@pytest.fixture(scope="module")
def reference(models, prompts):
    ref, _ = models
    outs = []
    with torch.no_grad():
        for p in prompts:
            seq = ref.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), max_new_tokens=GREEDY.max_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
            outs.append(seq[0, len(p) :].tolist())
    return outs


def make_engine(models, embeds=False, **kw) -> AREngine:
    args = dict(block_size=4, num_blocks=96, max_model_len=64, max_num_batched_tokens=64, max_num_seqs=16)
    args.update(kw)
    return AREngine(HFAdapter(models[1], embeds=embeds), EngineConfig(**args))


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


# ---- prefix caching -------------------------------------------------------------------------
def _conversation(seed: int, turns: int, system: list[int]) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (5, 3, 6, 4)[:turns]]


def test_prefix_cache_multi_turn_equal_outputs_and_only_new_tokens_computed(models):
    system = list(range(10, 19))  # 9 tokens shared by every conversation
    on, off = make_engine(models, max_model_len=128), make_engine(models, max_model_len=128, enable_prefix_caching=False)
    convo: list[int] = list(system)
    for i, user in enumerate(_conversation(5, 4, system)):
        convo = convo + user
        before = on.stats()
        got = on.generate([convo], GREEDY)[0]
        assert got == off.generate([convo], GREEDY)[0]
        after = on.stats()
        hit = after["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"]
        computed = after["num_computed_tokens"] - before["num_computed_tokens"]
        if i == 0:
            assert hit == 0
        else:  # every full block of the previous turn (its prompt and answer) is reused
            assert hit == min(prev_computed // 4, (len(convo) - 1) // 4) * 4 and hit >= len(convo) - len(user) - 4 - 12
        assert computed == len(convo) - hit + GREEDY.max_tokens - 1  # the new tokens only, then the decodes
        prev_computed = len(convo) + GREEDY.max_tokens - 1  # the newest token is never computed
        convo = convo + got
    s = on.stats()
    assert 0 < s["prefix_cache_hit_rate"] < 1 and s["prefix_cache_queried_tokens"] > s["prefix_cache_hit_tokens"]
    assert s["free_blocks"] == s["total_blocks"] and s["cached_free_blocks"] > 0
    on.scheduler.blocks.check()
    # a shared system prompt across concurrent requests: the later ones hit the first's blocks
    others = [system + u for u in _conversation(9, 4, system)]
    assert on.generate(others, GREEDY) == off.generate(others, GREEDY)
    assert off.stats()["prefix_cache_queried_tokens"] == 0


def test_prefix_cache_never_serves_the_whole_prompt(models, prompts):
    eng = make_engine(models)
    p = prompts[3][:16]  # 4 full blocks
    first = eng.generate([p], GREEDY)
    hits = eng.stats()["prefix_cache_hit_tokens"]
    assert eng.generate([p], GREEDY) == first
    assert eng.stats()["prefix_cache_hit_tokens"] - hits == 12  # the last block is recomputed for its logits


def test_prefix_cache_taps_of_cached_positions_equal_recomputed(models, prompts):
    kw = dict(tap_layers=(0, 2, 3), max_num_batched_tokens=6)
    on, off = make_engine(models, **kw), make_engine(models, enable_prefix_caching=False, **kw)
    base = prompts[3] + prompts[1]  # 28 tokens

    def run(eng, prompt, hidden=True):
        seq = eng.add_request(f"t{eng.num_steps}", prompt, GREEDY, return_hidden=hidden)
        rows = {t: [] for t in kw["tap_layers"]}
        while not seq.is_finished:
            for o in eng.step():
                assert not o.taps or o.tap_start == sum(r.shape[0] for r in rows[0])  # contiguous
                for t, h in o.taps.items():
                    rows[t].append(h)
        return list(seq.output_token_ids), {t: torch.cat(r) if r else None for t, r in rows.items()}, seq

    run(on, base, hidden=False)  # caches blocks without taps: a tapping request must not use them
    _, taps_first, seq = run(on, base + [1, 2])
    assert seq.num_cached_tokens == 0
    out_on, taps_on, seq = run(on, base + [3, 4, 5])  # reuses the tapped blocks
    assert seq.num_cached_tokens == 28
    out_off, taps_off, _ = run(off, base + [3, 4, 5])
    assert out_on == out_off
    for t in kw["tap_layers"]:
        assert taps_on[t].shape[0] == len(base) + 3 + GREEDY.max_tokens - 1  # every position, cached ones too
        torch.testing.assert_close(taps_on[t], taps_off[t], atol=1e-4, rtol=1e-4)
        assert torch.equal(taps_on[t][:28], taps_first[t][:28])  # the rows kept when they were computed
    run(on, base + [6], hidden=False)  # a request without taps reuses tapped blocks too
    on.scheduler.blocks.check()


def test_prefix_cache_eviction_under_memory_pressure_leaks_nothing(models, prompts, reference):
    eng = make_engine(models, num_blocks=16)  # 64 slots: one long sequence's worth
    first = eng.generate([prompts[3]], GREEDY)
    assert first == [reference[3]]
    for p, ref in zip(prompts, reference):  # each alone: cached blocks are evicted to make room
        assert eng.generate([p], GREEDY) == [ref]
        eng.scheduler.blocks.check()
    assert eng.generate(prompts, GREEDY) == reference  # together: preemption over shared and cached blocks
    assert eng.stats()["num_preemptions"] > 0
    hits = eng.stats()["prefix_cache_hit_tokens"]
    assert eng.generate([prompts[3]], GREEDY) == [reference[3]]
    s = eng.stats()
    assert s["free_blocks"] == s["total_blocks"] == 16 and s["running"] == s["waiting"] == 0
    assert s["prefix_cache_hit_tokens"] >= hits
    eng.scheduler.blocks.check()


def test_prefix_cache_preemption_with_shared_blocks(models):
    common = list(range(20, 40))  # 20 tokens = 5 full blocks shared by every request
    g = torch.Generator().manual_seed(4)
    batch = [common + torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (3, 7, 2, 9, 5, 4)]
    off = make_engine(models, enable_prefix_caching=False)
    want = [off.generate([p], GREEDY)[0] for p in batch]
    eng = make_engine(models, num_blocks=24, max_num_batched_tokens=16)
    eng.generate([common + [1]], GREEDY)  # the common prefix is cached
    assert eng.generate(batch, GREEDY) == want
    s = eng.stats()
    assert s["num_preemptions"] > 0 and s["prefix_cache_hit_tokens"] >= 20 * len(batch)
    assert s["free_blocks"] == s["total_blocks"]
    eng.scheduler.blocks.check()


def test_prefix_cache_abort_drops_references(models):
    common = list(range(30, 46))  # 4 blocks
    eng = make_engine(models)
    eng.generate([common + [5]], GREEDY)
    a = eng.add_request("a", common + [1, 2], GREEDY)
    b = eng.add_request("b", common + [3], GREEDY)
    eng.step()
    bm = eng.scheduler.blocks
    shared = a.block_table[:4]
    assert shared == b.block_table[:4] and all(bm._ref[x] == 2 for x in shared)
    assert eng.abort("a")
    assert all(bm._ref[x] == 1 for x in shared)
    while not b.is_finished:
        eng.step()
    assert b.output_token_ids == make_engine(models, enable_prefix_caching=False).generate([common + [3]], GREEDY)[0]
    assert all(bm._ref[x] == 0 for x in shared) and eng.stats()["free_blocks"] == eng.stats()["total_blocks"]
    bm.check()


def test_prefix_cache_stats_reach_metrics(models, prompts):
    pytest.importorskip("prometheus_client")
    from omni.api.metrics import _StageCollector

    eng = make_engine(models)
    eng.generate([prompts[3]] * 2, GREEDY)
    eng.generate([prompts[3]], GREEDY)
    collector = _StageCollector()
    collector.snapshot = {"thinker.0": eng.stats()}
    gauges = {m.name: m.samples[0].value for m in collector.collect()}
    assert gauges["omni_stage_prefix_cache_hit_tokens"] == 16 and gauges["omni_stage_prefix_cache_queried_tokens"] == 3 * 17
    assert 0 < gauges["omni_stage_prefix_cache_hit_rate"] < 1


@pytest.mark.parametrize("taps", [(), (0, 2)])
def test_prefix_cache_random_traffic_keeps_invariants(models, taps):
    """Requests sharing prefixes arrive, finish and get aborted at random in a small cache: every
    finished output equals the cache-off output, and the block invariants hold after each step.
    With taps, every other request returns them: each position's rows exactly once, in order."""
    g = torch.Generator().manual_seed(12)
    stems = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (9, 14, 5)]
    reqs = [stems[i % 3] + torch.randint(0, VOCAB, (int(k),), generator=g).tolist()
            for i, k in enumerate(torch.randint(1, 9, (14,), generator=g))]
    off = make_engine(models, enable_prefix_caching=False)
    want = [off.generate([p], GREEDY)[0] for p in reqs]
    eng = make_engine(models, num_blocks=20, max_num_batched_tokens=12, max_num_seqs=5, tap_layers=taps)
    seqs, pending, rows = {}, list(range(len(reqs))), {}
    for step in range(2000):
        if pending and step % 2 == 0:
            i = pending.pop(0)
            seqs[i] = eng.add_request(f"q{i}", reqs[i], GREEDY, return_hidden=bool(taps) and i % 2 == 0)
        if step % 7 == 3:
            live = [i for i, s in seqs.items() if not s.is_finished and i % 4 == 1]
            if live:
                eng.abort(f"q{live[0]}")
        for o in eng.step():
            if o.taps:
                assert o.tap_start == rows.get(o.rid, 0)
                rows[o.rid] = o.tap_start + o.taps[0].shape[0]
        eng.scheduler.blocks.check()
        if not pending and not eng.has_unfinished():
            break
    done = [i for i, s in seqs.items() if s.finish_reason is not None and s.finish_reason.value != "abort"]
    assert len(done) >= 8
    for i in done:
        assert seqs[i].output_token_ids == want[i], i
        if taps and i % 2 == 0:
            assert rows[f"q{i}"] == seqs[i].num_tokens - 1
    s = eng.stats()
    assert s["prefix_cache_hit_tokens"] > 0 and s["num_preemptions"] > 0 and s["free_blocks"] == 20
