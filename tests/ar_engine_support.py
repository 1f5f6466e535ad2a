"""The AR engine's test rig: a tiny random Qwen3 LLM from transformers whose attention is routed
through omni's paged cache (`HFAdapter`), its prompts and its own greedy `generate` outputs, shared
by tests/test_ar_engine.py and tests/test_ar_engine_prefix_cache.py."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from omni.stages.ar.config import EngineConfig  # noqa: E402
from omni.stages.ar.engine import AREngine  # noqa: E402
from omni.stages.ar.model_api import ARModel, ForwardOutput, KVCacheSpec  # noqa: E402
from omni.stages.ar.sequence import SamplingParams  # noqa: E402

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
