"""Make the Qwen3-TTS reference's 12 Hz tokenizer run on the installed transformers (5.24).

qwen-tts-hf 0.1.1.post1 targets transformers 5.15; 5.24 split `MimiModel` into encoder/decoder
halves, which breaks three pieces of the reference's glue (none of its arithmetic):

- `Qwen3TTSTokenizerV2Encoder.__init__` sets `self.upsample = None` (now a read-only property):
  it wants MimiModel without its decoding half, which 5.24 spells `decoder = None`.
- The reference registers a "default" RoPE initialiser reading `config.rope_theta`; 5.24's Mimi
  configs carry `rope_parameters` instead: same formula, read from there.
- Published tokenizer checkpoints keep Mimi's flat layout (`encoder.encoder.layers.*`); 5.24
  renames it only for its own MimiModel, not for the reference's subclass: register the same renames.

`patch()` is idempotent, a no-op on a transformers that did not split Mimi, and touches only the
reference's classes and registries (`qwen3_tts_reference.load()` calls it).
"""

from __future__ import annotations

_DONE = False


def patch() -> None:
    global _DONE
    if _DONE:
        return
    import torch
    from transformers import MimiModel
    from transformers.conversion_mapping import (
        get_checkpoint_conversion_mapping,
        register_checkpoint_conversion_mapping,
    )
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    _DONE = True
    if not isinstance(getattr(MimiModel, "upsample", None), property):  # an unsplit Mimi: nothing to mend
        return

    import qwen_tts._transformers_compat as compat
    from qwen_tts.core.tokenizer_12hz import modeling_qwen3_tts_tokenizer_v2 as tokenizer

    def encoder_init(self, config):
        MimiModel.__init__(self, config)
        self.config = config
        self.decoder = None

    tokenizer.Qwen3TTSTokenizerV2Encoder.__init__ = encoder_init

    shipped = compat._default_rope_parameters

    def default_rope(config, device=None, seq_len=None, layer_type=None):
        if getattr(config, "rope_theta", None) is not None:
            return shipped(config, device, seq_len, layer_type)
        base = config.rope_parameters["rope_theta"]
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float)
                                   / dim))
        return inv_freq, 1.0

    ROPE_INIT_FUNCTIONS["default"] = default_rope
    register_checkpoint_conversion_mapping("Qwen3TTSTokenizerV2Encoder",
                                           get_checkpoint_conversion_mapping("MimiModel"), overwrite=True)
