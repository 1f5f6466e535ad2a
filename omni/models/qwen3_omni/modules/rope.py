"""Qwen3-Omni's M-RoPE position index: the shared one (omni/layers/mrope_index.py)."""

from omni.layers.mrope_index import RopeTokens, VisionGrid, rope_index

__all__ = ["RopeTokens", "VisionGrid", "rope_index"]
