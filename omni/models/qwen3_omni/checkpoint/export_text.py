"""The thinker's text model as a plain Qwen3-MoE checkpoint (`Qwen3MoeForCausalLM`).

Why: SGLang (and any Qwen3-MoE server) can then run the thinker for text prompts. For a text-only
prompt Qwen3-Omni's M-RoPE gives every section the same position, so it equals the 1-D rope of
Qwen3-MoE with the same theta: the exported model computes the same logits and hidden states
(tests/test_export_text.py checks greedy tokens with transformers' Qwen3MoeForCausalLM). Prompts
with audio, images or video need the 3-D positions and are not for this export.

`export_thinker_text(model_dir, out_dir)` writes config.json, the tokenizer files, and the
weights as one safetensors file with per-expert names (`...mlp.experts.E.gate_proj.weight`,
what Qwen3-MoE loaders expect); `weights=False` writes the config alone (for SGLang's
`load_format="dummy"`, the random-weights benchmarks).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from omni.layers.configs import DecoderConfig
from omni.models.qwen3_omni.config import load_config
from omni.models.qwen3_omni.modules.thinker_layers import text_state_dict
from omni.models.weights import load_state_dict

ARCHITECTURE = "Qwen3MoeForCausalLM"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "chat_template.jinja", "added_tokens.json", "generation_config.json")


def qwen3_moe_config(text: DecoderConfig, eos_token_id: int | None = None, dtype: str = "bfloat16") -> dict[str, Any]:
    """transformers' `Qwen3MoeConfig` fields for the thinker's text decoder."""
    out = {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3_moe",
        "vocab_size": text.vocab_size,
        "hidden_size": text.hidden_size,
        "intermediate_size": text.intermediate_size,
        "moe_intermediate_size": text.moe_intermediate_size,
        "num_hidden_layers": text.num_layers,
        "num_attention_heads": text.num_heads,
        "num_key_value_heads": text.num_kv_heads,
        "head_dim": text.head_dim,
        "hidden_act": text.hidden_act,
        "rms_norm_eps": text.rms_norm_eps,
        "rope_theta": text.rope_theta,
        "max_position_embeddings": text.max_position_embeddings,
        "num_experts": text.num_experts,
        "num_experts_per_tok": text.num_experts_per_tok,
        "norm_topk_prob": text.norm_topk_prob,
        "decoder_sparse_step": text.decoder_sparse_step,
        "mlp_only_layers": list(text.mlp_only_layers),
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
    }
    if eos_token_id is not None:
        out["eos_token_id"] = eos_token_id
    return out


def per_expert_names(state: dict[str, torch.Tensor], text: DecoderConfig) -> dict[str, torch.Tensor]:
    """omni's stacked experts ([E, 2I, H] gate+up, [E, H, I] down) as per-expert tensors."""
    out = {}
    for name, tensor in state.items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            for e in range(tensor.shape[0]):
                gate, up = tensor[e].chunk(2, dim=0)
                out[f"{base}{e}.gate_proj.weight"] = gate.contiguous()
                out[f"{base}{e}.up_proj.weight"] = up.contiguous()
        elif name.endswith(".mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(tensor.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = tensor[e].contiguous()
        else:
            out[name] = tensor.contiguous()
    return out


def export_thinker_text(model_dir: str | Path, out_dir: str | Path, weights: bool = True,
                        dtype: torch.dtype | None = None) -> Path:
    """Write the thinker's text model under `out_dir` (created) and return it."""
    model_dir, out = Path(model_dir), Path(out_dir)
    cfg = load_config(model_dir)
    text = cfg.thinker.text
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (model_dir / name).exists():
            shutil.copy2(model_dir / name, out / name)
    dtype_name = str(dtype).removeprefix("torch.") if dtype is not None else "bfloat16"
    if weights:
        from safetensors.torch import save_file

        state = text_state_dict(load_state_dict(model_dir, "thinker", dtype=dtype), text)
        state = per_expert_names(state, text)
        some = next(iter(state.values()))
        dtype_name = str(some.dtype).removeprefix("torch.")
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = qwen3_moe_config(text, cfg.im_end_token_id, dtype_name)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def cached_export(model_dir: str | Path, weights: bool = True, root: str | Path | None = None) -> Path:
    """`export_thinker_text` into a cache directory (default ~/.cache/omni/sglang-text), reused while
    the source checkpoint's config.json is unchanged (the export of real weights takes minutes)."""
    import hashlib

    from omni import env

    src = Path(model_dir).resolve()
    stamp = f"{src}|{(src / 'config.json').stat().st_mtime_ns}|weights={weights}"
    base = Path(root) if root else env.cache_dir() / "sglang-text"
    out = base / hashlib.sha1(stamp.encode()).hexdigest()[:16]
    marker = out / ".omni-export"
    if marker.exists() and marker.read_text() == stamp:
        return out
    export_thinker_text(src, out, weights=weights)
    marker.write_text(stamp)
    return out
