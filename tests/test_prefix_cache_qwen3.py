"""Prefix caching on the Qwen3-Omni thinker (tiny checkpoint): multi-turn chats reuse earlier
turns with the same tokens and taps as without the cache, and media rows are part of the key."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny  # noqa: E402
from omni.models.qwen3_omni.modules.thinker import Qwen3OmniThinker  # noqa: E402
from omni.layers.tokenizer_offline import token_ids  # noqa: E402
from omni.stages.ar.config import EngineConfig  # noqa: E402
from omni.stages.ar.engine import AREngine  # noqa: E402
from omni.stages.ar.sequence import SamplingParams  # noqa: E402

IDS = token_ids()
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def _turn(role: str, text: bytes | list[int]) -> list[int]:
    return [IDS["<|im_start|>"], IDS[role], 10, *list(text), IDS["<|im_end|>"], 10]


def _assistant() -> list[int]:
    return [IDS["<|im_start|>"], IDS["assistant"], 10]


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    return Qwen3OmniThinker.from_checkpoint(make_tiny(tmp_path_factory.mktemp("tiny-a"), seed=3, preset="tiny-a"))


def _engine(model, **kw) -> AREngine:
    taps = (0, model.cfg.text.num_layers)
    return AREngine(model, EngineConfig(block_size=4, num_blocks=128, max_model_len=256, max_num_batched_tokens=32,
                                        tap_layers=taps, **kw))


def _run(eng: AREngine, prompt: list[int], inputs=None, hidden: bool = True):
    seq = eng.add_request(f"r{eng.num_steps}-{len(prompt)}", prompt, GREEDY, inputs=inputs, return_hidden=hidden)
    rows: dict[int, list] = {t: [] for t in eng.config.tap_layers}
    while not seq.is_finished:
        for o in eng.step():
            for t, h in o.taps.items():
                rows[t].append(h)
    taps = {t: torch.cat(r) for t, r in rows.items() if r}
    return list(seq.output_token_ids), taps, seq


@pytest.mark.parametrize("graphs", [False, True])
def test_multi_turn_chat_reuses_turns_with_equal_tokens_and_taps(thinker, graphs):
    """With `graphs`, decode steps take the fixed-shape graph path (run eagerly on CPU), taps included."""
    on, off = _engine(thinker, cuda_graphs=graphs), _engine(thinker, enable_prefix_caching=False)
    convo = _turn("system", b"you are brief")
    for i, user in enumerate((b"hello there", b"and then?", b"why so?")):
        prompt = convo + _turn("user", user) + _assistant()
        before = on.stats()
        got, taps, seq = _run(on, prompt)
        want, want_taps, _ = _run(off, prompt)
        assert got == want
        for t in want_taps:
            assert taps[t].shape[0] == len(prompt) + GREEDY.max_tokens - 1  # cached positions' taps too
            torch.testing.assert_close(taps[t], want_taps[t], atol=1e-4, rtol=1e-4)
        after = on.stats()
        computed = after["num_computed_tokens"] - before["num_computed_tokens"]
        assert computed == len(prompt) - seq.num_cached_tokens + GREEDY.max_tokens - 1
        hits = after["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"]
        assert hits == seq.num_cached_tokens
        assert after["prefix_cache_queried_tokens"] - before["prefix_cache_queried_tokens"] == len(prompt)
        if i:  # the earlier turns (prompt and answer) come from the cache: only the new turn is computed
            assert seq.num_cached_tokens == prev_computed // 4 * 4 > len(convo) - 8
            # the prefill: the tokens new since the last turn, plus the last turn's unfilled block
            assert computed - (GREEDY.max_tokens - 1) == len(prompt) - prev_computed + prev_computed % 4
        else:
            assert hits == 0
        prev_computed = len(prompt) + GREEDY.max_tokens - 1  # the last sampled token is never computed
        convo = prompt + got + [IDS["<|im_end|>"], 10]
    on.scheduler.blocks.check()
    assert (on.stats().get("decode_graph_steps", 0) > 0) == graphs


def test_media_rows_are_part_of_the_key(thinker):
    h = thinker.cfg.text.hidden_size
    g = torch.Generator().manual_seed(0)
    audio_a, audio_b = torch.randn(6, h, generator=g), torch.randn(6, h, generator=g)
    audio = [IDS["<|audio_start|>"], *[IDS["<|audio_pad|>"]] * 6, IDS["<|audio_end|>"]]
    prompt = _turn("system", b"hi there") + _turn("user", [*b"listen ", *audio, *b" ok"]) + _assistant()
    first_audio = prompt.index(IDS["<|audio_pad|>"])
    on, off = _engine(thinker), _engine(thinker, enable_prefix_caching=False)
    got_a, _, _ = _run(on, prompt, {"audio_embeds": audio_a})
    assert got_a == _run(off, prompt, {"audio_embeds": audio_a})[0]
    # the same token ids with other audio: only the blocks before the audio are reused
    got_b, taps_b, seq = _run(on, prompt, {"audio_embeds": audio_b})
    assert seq.num_cached_tokens == first_audio // 4 * 4
    want_b, want_taps, _ = _run(off, prompt, {"audio_embeds": audio_b})
    assert got_b == want_b
    torch.testing.assert_close(taps_b[0], want_taps[0], atol=1e-5, rtol=1e-5)
    # the same audio again: everything but the last block
    got, _, seq = _run(on, prompt, {"audio_embeds": audio_a})
    assert got == got_a and seq.num_cached_tokens == (len(prompt) - 1) // 4 * 4
    on.scheduler.blocks.check()
