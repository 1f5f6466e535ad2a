"""`OmniQwen3MoeTaps`: SGLang's Qwen3-MoE that also returns the hidden states of chosen layers.

Why: the talker consumes the thinker's layer-0 (embedding) and `accept_hidden_layer` rows, and
SGLang's `return_hidden_states` gives only the last layer's. SGLang already captures auxiliary
layers for EAGLE3 (`set_eagle3_layers_to_capture`: the residual stream entering each listed
layer, i.e. transformers' `hidden_states[i]`) and packs them into the returned hidden states
when the model's `capture_aux_hidden_states` is set; this subclass turns that on for the layers in
`OMNI_SGLANG_TAP_LAYERS` (comma-separated, ascending), so each returned row is
concat(tap_0, tap_1, ...). Tested with sglang 0.5.17; delete when SGLang can return chosen
layers' hidden states itself.
"""

from __future__ import annotations

import os

from sglang.srt.models.qwen3_moe import Qwen3MoeForCausalLM

TAP_LAYERS_ENV = "OMNI_SGLANG_TAP_LAYERS"


def tap_layers_from_env() -> list[int]:
    raw = os.environ.get(TAP_LAYERS_ENV, "")
    return sorted({int(x) for x in raw.split(",") if x.strip()})


class OmniQwen3MoeTaps(Qwen3MoeForCausalLM):
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__(config, quant_config=quant_config, prefix=prefix)
        layers = tap_layers_from_env()
        bad = [i for i in layers if not 0 <= i < config.num_hidden_layers]
        if bad:
            raise ValueError(f"{TAP_LAYERS_ENV}: layers {bad} outside [0, {config.num_hidden_layers})")
        if layers:
            self.capture_aux_hidden_states = True
            self.model.set_eagle3_layers_to_capture(layers)  # the inputs of these layers


EntryClass = OmniQwen3MoeTaps
