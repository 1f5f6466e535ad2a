"""Make the Qwen3-TTS reference's 12 Hz tokenizer load on the installed transformers (5.17 .. 5.25).

qwen-tts-hf 0.1.1.post1 targets transformers 5.15. Later releases break pieces of its glue (none
of its arithmetic):

- (5.17 and 5.24) The reference registers a "default" RoPE initialiser reading `config.rope_theta`;
  Mimi configs carry `rope_parameters` instead, and transformers' weight initialisation calls the
  "default" entry with a MimiConfig (`'MimiConfig' object has no attribute 'rope_theta'`): the
  same formula, with the base read from `rope_parameters` when `rope_theta` is absent.
- (5.24, which split `MimiModel` into encoder/decoder halves) `Qwen3TTSTokenizerV2Encoder.__init__`
  sets `self.upsample = None` (now a read-only property): it wants MimiModel without its decoding
  half, which 5.24 spells `decoder = None`.
- (5.24) Published tokenizer checkpoints keep Mimi's flat layout (`encoder.encoder.layers.*`);
  5.24 renames it only for its own MimiModel, not for the reference's subclass: register the same
  renames.

- (5.25) AutoModel passes `_from_auto` into the model class's `from_pretrained`; the reference forwards
  its kwargs to its speech tokenizer's own `AutoModel.from_pretrained`, which sets it again ("got
  multiple values for keyword argument '_from_auto'"): the tokenizer's loader drops it.

`patch()` is idempotent and touches only the reference's classes and registries
(`qwen3_tts_reference.load()` calls it, for any transformers).
"""

from __future__ import annotations

_DONE = False


def patch() -> None:
    global _DONE
    if _DONE:
        return
    from transformers import MimiModel

    _DONE = True
    _patch_default_rope()
    _patch_forwarded_auto_kwargs()
    if isinstance(getattr(MimiModel, "upsample", None), property):  # 5.24 split Mimi in halves
        _patch_split_mimi()


def _patch_default_rope() -> None:
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    import qwen_tts._transformers_compat as compat

    shipped = compat._default_rope_parameters

    def default_rope(config, device=None, seq_len=None, layer_type=None):
        if getattr(config, "rope_theta", None) is not None:
            return shipped(config, device, seq_len, layer_type)
        params = config.rope_parameters
        if layer_type is not None and layer_type in params:
            params = params[layer_type]
        base = params["rope_theta"]
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dim = int(dim * params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)))
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float)
                                   / dim))
        return inv_freq, 1.0

    if ROPE_INIT_FUNCTIONS.get("default") in (None, shipped):
        ROPE_INIT_FUNCTIONS["default"] = default_rope
    compat._default_rope_parameters = default_rope  # what the reference's patch registers later


def _patch_forwarded_auto_kwargs() -> None:
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer

    shipped = Qwen3TTSTokenizer.from_pretrained.__func__

    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        kwargs.pop("_from_auto", None)  # AutoModel sets it itself
        return shipped(cls, pretrained_model_name_or_path, **kwargs)

    Qwen3TTSTokenizer.from_pretrained = classmethod(from_pretrained)


def _patch_split_mimi() -> None:
    from transformers import MimiModel
    from transformers.conversion_mapping import (
        get_checkpoint_conversion_mapping,
        register_checkpoint_conversion_mapping,
    )

    from qwen_tts.core.tokenizer_12hz import modeling_qwen3_tts_tokenizer_v2 as tokenizer

    def encoder_init(self, config):
        MimiModel.__init__(self, config)
        self.config = config
        self.decoder = None

    tokenizer.Qwen3TTSTokenizerV2Encoder.__init__ = encoder_init
    register_checkpoint_conversion_mapping("Qwen3TTSTokenizerV2Encoder",
                                           get_checkpoint_conversion_mapping("MimiModel"), overwrite=True)
