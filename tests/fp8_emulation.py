"""The FP8 kernels' maths emulated on CPU, for tests: a dequantized model whose decoder linears and
experts see their inputs quantized as the kernels quantize them (per token and group of 128, e4m3;
`omni.layers.fp8_gemm.quantized_activations`), in float32. On a tiny random model that rounding
alone moves the final hidden states by a few percent, and where it flips a token's expert choice, by
far more: the figures an FP8 model on a GPU is held to."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

import omni.layers.moe as moe
from omni.layers.fp8_gemm import quantized_activations

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _q(x: torch.Tensor) -> torch.Tensor:
    return quantized_activations(x).to(x.dtype)


def _experts(x, weights, chosen, gate_up, down, act):
    out = torch.zeros_like(x)
    for expert in chosen.unique().tolist():
        token, slot = torch.where(chosen == expert)
        gate, up = F.linear(_q(x[token]), gate_up[expert]).chunk(2, dim=-1)
        y = F.linear(_q(act(gate) * up), down[expert]) * weights[token, slot, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out


@contextlib.contextmanager
def fp8_activations(model: torch.nn.Module, monkeypatch, routes: list | None = None):
    """Within: `model`'s decoder projections and experts take quantized activations; `routes` collects
    every MoE call's expert ids. Yields how many projections were hooked."""
    hooks = [m.register_forward_pre_hook(lambda mod, args: (_q(args[0]),))
             for name, m in model.named_modules()
             if isinstance(m, torch.nn.Linear) and ".layers." in name and name.rsplit(".", 1)[-1] in PROJECTIONS]
    monkeypatch.setattr(moe, "per_expert", _experts)
    monkeypatch.setattr(moe, "grouped_on_cpu", lambda x: False)
    record_routes(monkeypatch, routes)
    try:
        yield len(hooks)
    finally:
        for h in hooks:
            h.remove()


def record_routes(monkeypatch, routes: list | None) -> None:
    if routes is None:
        return
    route = moe.route_topk

    def recording(logits, top_k, norm_topk):
        weights, chosen = route(logits, top_k, norm_topk)
        routes.append(chosen.clone())
        return weights, chosen

    monkeypatch.setattr(moe, "route_topk", recording)
