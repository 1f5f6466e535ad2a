"""A Qwen-style tokenizer built offline (no hub): byte-level BPE without merges plus the
special and role tokens Qwen3-Omni's prompts need, saved so `AutoTokenizer` reloads it.

Every byte is one token (ids 0..255); special tokens follow in `SPECIAL_TOKENS` order, then
the role words, so ids are fixed and a tiny config can name them.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|tts_pad|>",
    "<|tts_bos|>",
    "<|tts_eos|>",
]
# Role words are plain (non-special) added tokens: "<|im_start|>assistant" must give the
# assistant role as one token, as the real vocabulary does.
ROLE_TOKENS = ["system", "user", "assistant"]

# Attribute names transformers' processors read from the tokenizer (tokenizer.audio_token ...).
EXTRA_SPECIAL_ATTRS = {
    "audio_token": "<|audio_pad|>",
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
}

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}{{- item['text'] -}}"
    "{%- elif item['type'] == 'audio' or item['type'] == 'input_audio' -%}"
    "{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- elif item['type'] == 'image' or item['type'] == 'image_url' -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] == 'video' -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def token_ids() -> dict[str, int]:
    """The fixed id of every special and role token."""
    ids = {tok: 256 + i for i, tok in enumerate(SPECIAL_TOKENS)}
    for j, role in enumerate(ROLE_TOKENS):
        ids[role] = 256 + len(SPECIAL_TOKENS) + j
    return ids


def vocab_size() -> int:
    return 256 + len(SPECIAL_TOKENS) + len(ROLE_TOKENS)


def build_tokenizer():
    """The `PreTrainedTokenizerFast` of the tiny checkpoints (byte-level BPE, no merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    byte_chars = sorted(ByteLevel.alphabet(), key=lambda ch: _byte_of(ch))
    vocab = {ch: i for i, ch in enumerate(byte_chars)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    from tokenizers import AddedToken

    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in ROLE_TOKENS])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=dict(EXTRA_SPECIAL_ATTRS),
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    _check_ids(tok)
    return tok


def save_tokenizer(out_dir: str | Path) -> None:
    build_tokenizer().save_pretrained(str(out_dir))


def _byte_of(ch: str) -> int:
    """The byte a ByteLevel alphabet character stands for (GPT-2's bytes_to_unicode)."""
    code = ord(ch)
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]


def _check_ids(tok) -> None:
    for token, want in token_ids().items():
        got = tok.convert_tokens_to_ids(token)
        if got != want:
            raise RuntimeError(f"tokenizer put {token!r} at id {got}, expected {want}")
    if len(tok) != vocab_size():
        raise RuntimeError(f"tokenizer has {len(tok)} tokens, expected {vocab_size()}")
