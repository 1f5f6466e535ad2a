"""The thinker split over the ranks of a tensor-parallel group (see omni/stages/ar/tensor_parallel.py).

Rank r of N holds: the query heads [r*Hq/N, (r+1)*Hq/N) and the matching key/value heads (so
its KV cache holds only those), the same slice of each expert's (and the dense MLP's)
intermediate dimension, and the rows of o_proj / down_proj that read them. Each rank's
attention output and MLP output are then partial sums of the full ones: one all-reduce after
each gives every rank the same hidden state as one unsplit model. The router and norms are
whole on every rank, the embeddings and lm_head on rank 0 only (it alone embeds and samples).

Weights are sliced when loaded: each rank reads the checkpoint (on the host), keeps its slices
and builds a model of the split sizes, so a rank's GPU only ever holds its shard. With
`load_format="random"` each rank draws its own slices (a seed per rank), which is right for
speed, not for output.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch import nn

from omni.models.qwen3_omni.config import ThinkerConfig


class AllReduced(nn.Module):
    """`inner`'s output summed over the ranks (in place)."""

    def __init__(self, inner: nn.Module, all_reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.inner = inner
        self.all_reduce = all_reduce

    def forward(self, *args: Any) -> torch.Tensor:
        return self.all_reduce(self.inner(*args).contiguous())


def shard_config(cfg: ThinkerConfig, size: int) -> ThinkerConfig:
    """The config of one rank's shard: heads and intermediate sizes divided by `size`."""
    t = cfg.text
    sizes = {"num_heads": t.num_heads, "num_kv_heads": t.num_kv_heads, "intermediate_size": t.intermediate_size}
    if t.num_experts:
        sizes["moe_intermediate_size"] = t.moe_intermediate_size
    bad = {k: v for k, v in sizes.items() if v % size}
    if bad:
        raise ValueError(f"tensor_parallel_size {size} must divide the thinker's {bad}")
    text = dataclasses.replace(t, **{k: v // size for k, v in sizes.items()})
    return dataclasses.replace(cfg, text=text)


def shard_state(state: dict[str, torch.Tensor], rank: int, size: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s slices of a thinker state dict named as `Qwen3OmniThinker` names it."""

    def part(t: torch.Tensor, dim: int) -> torch.Tensor:
        return t.chunk(size, dim)[rank].clone()

    out = {}
    for name, tensor in state.items():
        if not name.startswith("model.layers."):
            out[name] = tensor
            continue
        tail = name.split(".", 3)[3]
        if tail in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                    "mlp.gate_proj.weight", "mlp.up_proj.weight"):
            out[name] = part(tensor, 0)  # heads / intermediate rows
        elif tail in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            out[name] = part(tensor, 1)
        elif tail == "mlp.experts.gate_up_proj":  # [E, 2I, H]: gate rows, then up rows
            gate, up = tensor.chunk(2, 1)
            out[name] = torch.cat([part(gate, 1), part(up, 1)], 1)
        elif tail == "mlp.experts.down_proj":  # [E, H, I]
            out[name] = part(tensor, 2)
        else:  # norms, router
            out[name] = tensor
    return out


def split(model: nn.Module, all_reduce: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    """Sum each layer's attention and MLP outputs over the ranks (after the weights are loaded)."""
    for layer in model.model.layers:
        layer.self_attn = AllReduced(layer.self_attn, all_reduce)
        layer.mlp = AllReduced(layer.mlp, all_reduce)
    return model


def drop_embeddings(model: nn.Module) -> nn.Module:
    """Ranks > 0 never embed nor sample: their embedding and lm_head keep their shapes' first
    axis (the vocabulary, which `kv_cache_spec` reports), dtype and device, and no memory."""
    for module in (model.model.embed_tokens, model.lm_head):
        w = module.weight
        module.weight = nn.Parameter(torch.empty(w.shape[0], 0, dtype=w.dtype, device=w.device), requires_grad=False)
    return model


def build_shard(rank: int, size: int, device: str, all_reduce: Callable, model_dir: str, dtype: str = "",
                load_format: str = "auto", seed: int = 0) -> nn.Module:
    """Rank `rank`'s `Qwen3OmniThinker` of `model_dir` (the `ShardRecipe` builder of ThinkerStage)."""
    from omni.models.qwen3_omni.checkpoint.random_load import random_thinker
    from omni.models.qwen3_omni.config import load_config
    from omni.models.qwen3_omni.modules.thinker import Qwen3OmniThinker
    from omni.models.qwen3_omni.modules.thinker_layers import text_state_dict
    from omni.models.weights import load_state_dict

    full = load_config(model_dir).thinker
    cfg = shard_config(full, size)
    if load_format == "random":
        model = random_thinker(cfg, device=device, dtype=getattr(torch, dtype or "bfloat16"), seed=seed + rank)
    else:
        torch_dtype = getattr(torch, dtype or "float32")
        state = text_state_dict(load_state_dict(model_dir, "thinker", dtype=torch_dtype), full.text)
        model = Qwen3OmniThinker(cfg, torch_dtype)
        model.load_weights(shard_state(state, rank, size))
        del state
    if rank > 0:
        drop_embeddings(model)
    return split(model.to(device).eval(), all_reduce)
