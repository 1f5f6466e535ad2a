"""The thinker's text model exported as a Qwen3-MoE checkpoint (what the SGLang backend serves)
gives transformers' Qwen3-Omni thinker greedy tokens and hidden states when transformers' own
`Qwen3MoeForCausalLM` loads it: the conversion and the M-RoPE == 1-D rope claim for text."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from omni.models.qwen3_omni.checkpoint.export_text import export_thinker_text  # noqa: E402
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny  # noqa: E402
from omni.layers.tokenizer_offline import token_ids  # noqa: E402

IDS = token_ids()
PROMPT = [IDS["<|im_start|>"], IDS["user"], 10, *b"hello there, how are you?", IDS["<|im_end|>"], 10,
          IDS["<|im_start|>"], IDS["assistant"], 10]


@pytest.fixture(scope="module", params=["tiny-a", "tiny-b"])
def exported(request, tmp_path_factory):
    ckpt = make_tiny(tmp_path_factory.mktemp(request.param), seed=5, preset=request.param)
    out = export_thinker_text(ckpt, tmp_path_factory.mktemp(request.param + "-text"))
    return ckpt, out


def _greedy(model, prompt, n=12):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=n, do_sample=False, eos_token_id=None,
                             output_hidden_states=True, return_dict_in_generate=True)
    return out.sequences[0, len(prompt):].tolist(), out.hidden_states[0]


def test_exported_text_model_matches_the_thinker(exported):
    ckpt, out = exported
    omni_hf = transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(ckpt)).eval()
    moe = transformers.Qwen3MoeForCausalLM.from_pretrained(str(out)).eval()
    assert moe.config.num_experts == omni_hf.config.thinker_config.text_config.num_experts
    ref_tokens, ref_hidden = _greedy(omni_hf.thinker, PROMPT)
    tokens, hidden = _greedy(moe, PROMPT)
    assert tokens == ref_tokens
    for layer in (0, len(hidden) // 2, len(hidden) - 1):  # prefill rows, as the talker's taps
        torch.testing.assert_close(hidden[layer], ref_hidden[layer], rtol=1e-4, atol=1e-4)


def test_config_only_export_for_dummy_weights(exported, tmp_path):
    ckpt, _ = exported
    out = export_thinker_text(ckpt, tmp_path / "cfg", weights=False)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["eos_token_id"] == IDS["<|im_end|>"]
    assert not (out / "model.safetensors").exists()
    assert (out / "tokenizer.json").exists() or (out / "tokenizer_config.json").exists()
