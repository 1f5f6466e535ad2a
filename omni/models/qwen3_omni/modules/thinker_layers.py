"""Qwen3-Omni's thinker text decoder: omni's shared decoder layers and their checkpoint names
(omni/layers/decoder_layer.py)."""

from omni.layers.decoder_layer import DecoderLayer, text_state_dict

__all__ = ["DecoderLayer", "text_state_dict"]
