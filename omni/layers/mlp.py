"""Feed-forward blocks: the gated (SwiGLU-style) MLP of the decoders and a plain two-layer MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni.layers.fused_linear import fuse_linears, still_fused

# config `hidden_act` names -> functions (transformers' meanings)
ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) (SwiGLU with act="silu"); biases only with `bias` (Qwen2.5-VL's vision MLP)."""

    def __init__(self, hidden: int, inner: int, act: str = "silu", bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)
        self.act = ACTIVATIONS[act]
        self.gate_up_proj: nn.Linear | None = None  # gate and up as one projection, once fused

    def fuse_projections(self) -> bool:
        """gate and up as one GEMM; their weights become views of it. Once per set of parts: a second
        engine on the same model keeps it (graphs captured by the first read its memory)."""
        if not still_fused(self.gate_up_proj, self.gate_proj, self.up_proj):
            self.gate_up_proj = fuse_linears(self.gate_proj, self.up_proj)
        return self.gate_up_proj is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(self.act(gate) * up)
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class MLP(nn.Module):
    """linear_fc2(act(linear_fc1(x))), with biases; in and out widths may differ."""

    def __init__(self, in_dim: int, inner: int, out_dim: int, act: str = "silu") -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(in_dim, inner, bias=True)
        self.linear_fc2 = nn.Linear(inner, out_dim, bias=True)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))
