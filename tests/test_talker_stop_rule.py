"""The talker's stop rule runs on the device (`CodecLM.goes_on`) and ends a stream exactly where the
host rule it replaced did: codec EOS, stop ids, failed rows, max_tokens and max_model_len."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from omni.stages.ar.sequence import SamplingParams
from omni.stages.codec_lm.model import CodecLM

EOS = 7


class Rule:
    """The rule's own code on a stand-in for the model (it reads only `ids` and `max_model_len`)."""

    goes_on = CodecLM.goes_on
    _room_for_one_more = CodecLM._room_for_one_more

    def __init__(self, max_model_len):
        self.ids = SimpleNamespace(codec_eos=EOS)
        self.max_model_len = max_model_len


def host_rule(model: Rule, seq, token: int) -> bool:
    """The rule as the host applied it per row before (omni/stages/codec_lm/model.py `_goes_on`)."""
    if token < 0:
        return False
    if token == model.ids.codec_eos or token in seq.params.stop_token_ids:
        return False
    if len(seq.output_token_ids) + 1 >= seq.params.max_tokens:
        return False
    return model.max_model_len is None or seq.num_tokens + 1 <= model.max_model_len


def _seq(prompt: int, outputs: int, max_tokens: int, stops: tuple[int, ...]):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=stops)
    return SimpleNamespace(params=params, output_token_ids=[3] * outputs, num_tokens=prompt + outputs)


@pytest.mark.parametrize("max_model_len", [None, 9, 12])
def test_device_rule_equals_host_rule(max_model_len):
    model = Rule(max_model_len)
    cases = list(itertools.product([0, 1, 3, 5, 8], [1, 2, 4, 6, 50], [(), (EOS,), (11, 12), (4, EOS, 13)],
                                   [-1, 0, 4, EOS, 11, 12, 13, 20]))
    seqs = [_seq(4, out, mt, stops) for out, mt, stops, _ in cases]
    tokens = torch.tensor([t for *_, t in cases])
    device = model.goes_on(seqs, tokens).tolist()
    host = [host_rule(model, seq, t) for seq, (*_, t) in zip(seqs, cases)]
    assert device == host
    assert any(device) and not all(device)


def test_stream_ends_where_the_host_rule_ended_it():
    """Step a few streams token by token: each stops at the same token under both rules."""
    model = Rule(max_model_len=30)
    g = torch.Generator().manual_seed(0)
    for max_tokens, stops in itertools.product([1, 2, 5, 17, 40], [(), (11,), (11, 12, 13)]):
        draws = torch.randint(0, 24, (40,), generator=g).tolist()
        ends = []
        for rule in ("device", "host"):
            seq = _seq(6, 0, max_tokens, stops)
            for k, token in enumerate(draws):
                go = (model.goes_on([seq], torch.tensor([token]))[0].item() if rule == "device"
                      else host_rule(model, seq, token))
                if not go:
                    break
                seq.output_token_ids.append(token)
                seq.num_tokens += 1
            ends.append(k)
        assert ends[0] == ends[1], (max_tokens, stops, draws)
