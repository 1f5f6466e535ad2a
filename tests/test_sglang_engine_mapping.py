"""`SGLangEngine`'s mapping of SGLang's streamed outputs onto omni's `StepOutput`s, on CPU.

SGLang itself cannot run here, so a stand-in `sglang.Engine` streams chunks in SGLang's format
(cumulative `output_ids`; `meta_info.hidden_states` resent whole: the prompt's rows as one list, then
one row per fed token; `finish_reason`). The real engine is checked on the GPU
(tests/test_sglang_gpu.py). Each hidden row of the stand-in encodes its position, so the tests
can tell a row from its neighbour.
"""

from __future__ import annotations

import asyncio
import json
import os
import types

import pytest

from omni.kernel.stage import StageContext
from omni.stages.ar.config import EngineConfig
from omni.stages.ar.sequence import SamplingParams
from omni.stages.ar import sglang_backend
from omni.vendor import sglang as vendor

TAPS = (0, 24)
TAPS_MODEL = "omni.vendor.sglang_models:OmniQwen3MoeTaps"  # what Qwen3-Omni's thinker stage names


class FakeTokenizerManager:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort_request(self, rid: str) -> None:
        self.aborted.append(rid)


class FakeEngine:
    """Streams `max_new_tokens` tokens per request in SGLang's chunk format."""

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.tokenizer_manager = FakeTokenizerManager()
        self.shut = False

    async def async_generate(self, input_ids, sampling_params, rid, stream, return_hidden_states):
        assert stream
        if 999 in input_ids:
            raise ValueError("the stand-in refuses token 999")
        return self._gen(list(input_ids), sampling_params, return_hidden_states)

    async def _gen(self, prompt, sampling, hidden):
        n, outs, rows = sampling["max_new_tokens"], [], []
        cached = 777 in prompt  # a prefix-cache hit: SGLang computes (and returns) the last row only
        forever = sampling.get("ignore_eos") and n >= 1000
        k = 0
        while forever or k < n:
            outs.append((sum(prompt) + 7 * k) % 97)
            if hidden:
                if k == 0:
                    first = len(prompt) - 1 if cached else 0
                    rows.append([[float(p), p + 0.5] for p in range(first, len(prompt))])
                else:
                    pos = len(prompt) + k - 1
                    rows.append([float(pos), pos + 0.5])
            done = not forever and k == n - 1
            yield {"output_ids": list(outs),
                   "meta_info": {"finish_reason": {"type": "length"} if done else None,
                                 "hidden_states": list(rows) if hidden else None}}
            k += 1
            await asyncio.sleep(0.001)

    def shutdown(self) -> None:
        self.shut = True


@pytest.fixture
def fake_sglang(monkeypatch):
    module = types.SimpleNamespace(Engine=FakeEngine)
    monkeypatch.setattr(vendor, "require", lambda feature: module)
    monkeypatch.delenv("SGLANG_EXTERNAL_MODEL_PACKAGE", raising=False)
    monkeypatch.delenv(vendor.TAP_LAYERS_ENV, raising=False)
    return module


def run_to_end(engine, rids, limit=2000):
    outs = {rid: [] for rid in rids}
    for _ in range(limit):
        for o in engine.step():
            outs[o.rid].append(o)
        if all(outs[r] and outs[r][-1].finished for r in rids):
            return outs
    raise AssertionError("requests did not finish")


def test_tokens_and_taps_match_positions(fake_sglang):
    cfg = EngineConfig(max_num_seqs=8, max_model_len=64, tap_layers=TAPS, eos_token_ids=(5,))
    eng = sglang_backend.SGLangEngine("/model", cfg, taps_model=TAPS_MODEL)
    try:
        assert json.loads(eng._sgl.kwargs["json_model_override_args"]) == {"architectures": ["OmniQwen3MoeTaps"]}
        assert os.environ["SGLANG_EXTERNAL_MODEL_PACKAGE"] == "omni.vendor.sglang_models"
        assert os.environ[vendor.TAP_LAYERS_ENV] == "0,24" and eng._sgl.kwargs["skip_tokenizer_init"]
        prompts = {"a": [1, 2, 3, 4, 5, 6], "b": [9, 8, 7]}
        eng.add_request("a", prompts["a"], SamplingParams(temperature=0.0, max_tokens=5), return_hidden=True)
        eng.add_request("b", prompts["b"], SamplingParams(temperature=0.0, max_tokens=3), return_hidden=False)
        outs = run_to_end(eng, ["a", "b"])
        for rid, n in (("a", 5), ("b", 3)):
            tokens = [t for o in outs[rid] for t in o.new_token_ids]
            assert tokens == [(sum(prompts[rid]) + 7 * k) % 97 for k in range(n)]
            assert outs[rid][-1].finish_reason == "length" and outs[rid][0].num_prompt_tokens == len(prompts[rid])
        assert all(not o.taps for o in outs["b"])
        rows = [o for o in outs["a"] if o.taps]
        assert rows[0].tap_start == 0 and rows[0].taps[0].shape == (6, 1)  # the prompt's rows come whole
        # contiguous rows; a loaded machine may drain several of SGLang's chunks in one step
        assert all(b.tap_start == a.tap_start + len(a.tap_token_ids) for a, b in zip(rows, rows[1:]))
        pos0 = [float(v) for o in rows for v in o.taps[0][:, 0]]
        pos24 = [float(v) for o in rows for v in o.taps[24][:, 0]]
        assert pos0 == [float(p) for p in range(6 + 5 - 1)] and pos24 == [p + 0.5 for p in pos0]
        fed = prompts["a"] + [t for o in outs["a"] for t in o.new_token_ids]
        assert [t for o in rows for t in o.tap_token_ids] == fed[: 6 + 5 - 1]
        assert not eng.has_work()
    finally:
        eng.shutdown()
    assert eng._sgl.shut


def test_sampling_mapping_and_limits(fake_sglang):
    cfg = EngineConfig(max_num_seqs=4, max_model_len=16, eos_token_ids=(5,))
    eng = sglang_backend.SGLangEngine("/model", cfg)
    try:
        assert "json_model_override_args" not in eng._sgl.kwargs  # no taps, stock model class
        sp = sglang_backend.sglang_sampling(SamplingParams(temperature=0.7, top_k=0, max_tokens=100, seed=3,
                                                           suppress_token_ids=(4,), logit_bias={6: 1.5},
                                                           min_p=0.1, presence_penalty=0.5), 12)
        assert sp["min_p"] == 0.1 and sp["presence_penalty"] == 0.5 and sp["frequency_penalty"] == 0.0
        assert sp["top_k"] == -1 and sp["max_new_tokens"] == 12 and sp["sampling_seed"] == 3
        assert sp["logit_bias"] == {"6": 1.5, "4": -float("inf")}
        with pytest.raises(sglang_backend.InvalidRequest):
            sglang_backend.sglang_sampling(SamplingParams(repetition_penalty=1.2, penalty_includes_prompt=False), 8)
        with pytest.raises(sglang_backend.InvalidRequest, match="no room"):
            eng.add_request("long", list(range(16)), SamplingParams(max_tokens=4))
        with pytest.raises(sglang_backend.InvalidRequest, match="logprobs"):  # refused, never answered without
            eng.add_request("lp", [1, 2], SamplingParams(max_tokens=4, logprobs=2))
        with pytest.raises(sglang_backend.InvalidRequest, match="token prompts only"):
            eng.add_request("mm", [1, 2], SamplingParams(max_tokens=4), inputs={"audio_embeds": [1]})
        eng.add_request("cap", list(range(10)), SamplingParams(temperature=0.0, max_tokens=50))
        outs = run_to_end(eng, ["cap"])
        assert sum(len(o.new_token_ids) for o in outs["cap"]) == 16 - 10  # capped by the context left
    finally:
        eng.shutdown()


def test_abort_and_errors_end_requests(fake_sglang):
    eng = sglang_backend.SGLangEngine("/model", EngineConfig(max_num_seqs=4, max_model_len=4096))
    try:
        eng.add_request("endless", [1, 2], SamplingParams(max_tokens=4000, ignore_eos=True))
        for _ in range(50):
            eng.step()
        assert eng.abort("endless") and not eng.abort("endless")
        eng.step()
        assert eng._sgl.tokenizer_manager.aborted == ["endless"] and "endless" not in eng._live
        eng.add_request("bad", [1, 999], SamplingParams(max_tokens=3))
        outs = run_to_end(eng, ["bad"])
        assert outs["bad"][-1].error and "refuses token 999" in outs["bad"][-1].error
    finally:
        eng.shutdown()


def test_stage_turns_engine_errors_into_request_errors(fake_sglang, tmp_path):
    from omni.stages.ar.stage import ARStage

    stage = ARStage(StageContext(name="lm", args={"backend": "sglang", "sglang_model_path": str(tmp_path),
                                                  "max_model_len": 64}))
    stage.setup()
    try:
        assert isinstance(stage.engine, sglang_backend.SGLangEngine)
        assert stage.engine._sgl.kwargs["mem_fraction_static"] == 0.7
        stage.open("r1", {"prompt_token_ids": [3, 999], "sampling": {"lm": {"max_tokens": 2}}})
        stage.open("r2", {"prompt_token_ids": [3, 4], "sampling": {"lm": {"max_tokens": 2, "temperature": 0.0}}})
        emits = []
        for _ in range(500):
            emits += stage.step()
            if sum(1 for e in emits if e.error or e.finish) == 2:
                break
        errors = [e for e in emits if e.error]
        assert [e.rid for e in errors] == ["r1"] and "999" in errors[0].error
        assert [e.rid for e in emits if e.finish] == ["r2"]
    finally:
        stage.teardown()
    assert stage.engine._sgl.shut


def test_taps_need_the_family_taps_model(fake_sglang):
    from omni.kernel.errors import GraphError

    with pytest.raises(GraphError, match="taps model class"):
        sglang_backend.SGLangEngine("/model", EngineConfig(max_num_seqs=4, max_model_len=64, tap_layers=TAPS))
    with pytest.raises(ValueError, match="package:Class"):
        sglang_backend.SGLangEngine("/model", EngineConfig(max_num_seqs=4, max_model_len=64, tap_layers=TAPS),
                                    taps_model="OmniQwen3MoeTaps")


def test_missing_prompt_rows_fail_the_request(fake_sglang):
    eng = sglang_backend.SGLangEngine("/model", EngineConfig(max_num_seqs=4, max_model_len=64, tap_layers=TAPS),
                                      taps_model=TAPS_MODEL)
    try:
        assert eng._sgl.kwargs["disable_radix_cache"]  # taps need every prompt row computed
        eng.add_request("hit", [777, 1, 2, 3], SamplingParams(temperature=0.0, max_tokens=4), return_hidden=True)
        outs = run_to_end(eng, ["hit"])
        assert "1 hidden-state rows for a 4-token prompt" in outs["hit"][-1].error
        assert not any(o.taps for o in outs["hit"])
        assert eng._sgl.tokenizer_manager.aborted == ["hit"]
    finally:
        eng.shutdown()


def test_tensor_parallel_size_becomes_tp_size(fake_sglang):
    one = sglang_backend.SGLangEngine("/model", EngineConfig(max_num_seqs=4, max_model_len=16))
    two = sglang_backend.SGLangEngine("/model", EngineConfig(max_num_seqs=4, max_model_len=16, device="cuda:2",
                                                             tensor_parallel_size=2))
    try:
        assert "tp_size" not in one._sgl.kwargs  # as before: SGLang's default of 1
        assert two._sgl.kwargs["tp_size"] == 2 and two._sgl.kwargs["base_gpu_id"] == 2
    finally:
        one.shutdown()
        two.shutdown()
    with pytest.raises(ValueError, match=">= 1"):
        vendor.parallel_server_args(0)
