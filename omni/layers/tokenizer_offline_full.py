"""A Qwen-style tokenizer built offline at the real vocabulary's ids: the full-size random-weight
presets of Qwen3-Omni and Qwen3-TTS (same text vocabulary) need prompts whose special and role
tokens sit where the published tokenizer has them. Bytes as in `tokenizer_offline`, no merges.
"""

from __future__ import annotations

from omni.layers.tokenizer_offline import CHAT_TEMPLATE, EXTRA_SPECIAL_ATTRS, _byte_of

# Real special-token ids of the Qwen vocabulary (Qwen3-Omni's, Qwen3-TTS's).
SPECIAL_IDS = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
    "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655, "<|video_pad|>": 151656,
    "<|audio_start|>": 151669, "<|audio_end|>": 151670,
    "<|tts_pad|>": 151671, "<|tts_bos|>": 151672, "<|tts_eos|>": 151673, "<|audio_pad|>": 151675,
}
ROLE_IDS = {"user": 872, "system": 8948, "assistant": 77091}


def build_tokenizer():
    """A byte-level tokenizer whose special and role tokens sit at the real Qwen ids (fillers
    between), so prompts built from it are valid for the full-size presets. Not the real merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    size = max(SPECIAL_IDS.values()) + 1
    vocab = {f"<|filler_{i}|>": i for i in range(size)}
    named = {**{ch: _byte_of(ch) for ch in ByteLevel.alphabet()}, **ROLE_IDS, **SPECIAL_IDS}
    for token, i in named.items():
        del vocab[f"<|filler_{i}|>"]
        vocab[token] = i
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_IDS])
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in ROLE_IDS])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  extra_special_tokens=dict(EXTRA_SPECIAL_ATTRS), model_max_length=65536,
                                  clean_up_tokenization_spaces=False)
    tok.chat_template = CHAT_TEMPLATE
    for token, want in {**SPECIAL_IDS, **ROLE_IDS}.items():
        if tok.convert_tokens_to_ids(token) != want:
            raise RuntimeError(f"tokenizer put {token!r} at {tok.convert_tokens_to_ids(token)}, expected {want}")
    return tok
