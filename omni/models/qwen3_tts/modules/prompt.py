"""The talker's prompt for one Qwen3-TTS request, built as the reference's `generate` builds it.

Rows are sums of a projected text row and a codec row (the talker reads both streams at once):

    [instruction rows]                                   (CustomVoice / VoiceDesign, optional)
    text(<|im_start|>assistant\\n)                         3 rows, no codec part
    tts_pad.. + tts_bos  +  codec(think tags, [speaker], pad)   one row per codec tag but the last
    then, by mode:
      streaming text:     text(first token) + codec(bos); the other text tokens + tts_eos trail,
                          one per generated frame, then tts_pad
      non-streaming text: text(all tokens) + tts_eos over codec(pad), then tts_pad + codec(bos);
                          only tts_pad trails
      in-context clone:   text(ref transcript + text) + tts_eos against codec(bos) + the reference
                          codes' frame sums (zipped while both last; the rest of the text trails)

`input_ids` are the whole tokenized "<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n"
and `ref_ids` the whole "<|im_start|>assistant\\n{ref_text}<|im_end|>\\n", sliced as the reference does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from omni.kernel.errors import InvalidRequest
from omni.models.qwen3_tts.config import Qwen3TTSConfig

ROLE_TOKENS = 3  # <|im_start|> assistant \n
TAIL_TOKENS = 5  # <|im_end|> \n <|im_start|> assistant \n
REF_TAIL_TOKENS = 2  # <|im_end|> \n

Embed = Callable[[torch.Tensor], torch.Tensor]  # ids [n] -> rows [n, H]


@dataclass
class PromptEmbedders:
    text: Embed  # text_projection(text_embedding(ids))
    codec: Embed  # talker codec_embedding(ids)
    frames: Callable[[torch.Tensor], torch.Tensor]  # codes [T, G] -> frame sums [T, H]


@dataclass
class TalkerPrompt:
    """What the talker sequence needs: prefill rows and the text rows that trail generated frames."""

    prefill: torch.Tensor  # [n, H]
    trailing_rows: torch.Tensor  # [m, H] (m may be 0)
    tts_pad: torch.Tensor  # [H]: what trails once trailing_rows are used up
    positions: torch.Tensor  # [3, n] float32
    delta: float = 0.0  # decode position = index + delta
    user_source = None  # no prefix caching of TTS prompts (the talker's prefix_key reads this)

    def trailing(self, k: int) -> torch.Tensor:
        return self.trailing_rows[k] if k < self.trailing_rows.shape[0] else self.tts_pad


@dataclass
class PromptSpec:
    """One request's prompt inputs (token ids from the preprocess stage, voice from the voice stage)."""

    input_ids: list[int]
    language: str = "auto"
    speaker: str | None = None  # CustomVoice: a named speaker
    instruct_ids: list[int] | None = None
    spk_embedding: torch.Tensor | None = None  # Base: the x-vector [H]
    ref_ids: list[int] | None = None  # Base in-context: the reference transcript
    ref_codes: torch.Tensor | None = None  # Base in-context: [T, G]
    non_streaming: bool = False

    @property
    def icl(self) -> bool:
        return self.ref_codes is not None


def language_id(cfg: Qwen3TTSConfig, language: str | None, speaker: str | None) -> int | None:
    """The codec language tag: none for "auto", a speaker's dialect for Chinese / auto."""
    lang = (language or "auto").lower()
    if lang != "auto" and lang not in cfg.languages:
        raise InvalidRequest(f"unsupported language {language!r}; supported: {', '.join(cfg.supported_languages)}")
    lid = None if lang == "auto" else cfg.languages[lang]
    if lang in ("chinese", "auto") and speaker and speaker.lower() in cfg.speaker_dialects:
        lid = cfg.languages[cfg.speaker_dialects[speaker.lower()]]
    return lid


def build_prompt(cfg: Qwen3TTSConfig, spec: PromptSpec, emb: PromptEmbedders, device) -> TalkerPrompt:
    ids = spec.input_ids
    if len(ids) < ROLE_TOKENS + TAIL_TOKENS + 1:
        raise InvalidRequest("the text to speak is empty")

    def t(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long, device=device)

    c = cfg.codec
    tts_bos, tts_eos, tts_pad = emb.text(t([cfg.text.tts_bos, cfg.text.tts_eos, cfg.text.tts_pad])).unbind(0)
    lid = language_id(cfg, spec.language, spec.speaker)
    tags = [c.nothink, c.think_bos, c.think_eos] if lid is None else [c.think, c.think_bos, lid, c.think_eos]
    codec_rows = [emb.codec(t(tags))]
    if spec.spk_embedding is not None:
        codec_rows.append(spec.spk_embedding.reshape(1, -1).to(codec_rows[0]))
    elif spec.speaker:
        name = spec.speaker.lower()
        if name not in cfg.speakers:
            raise InvalidRequest(f"unknown speaker {spec.speaker!r}; speakers: {', '.join(cfg.speakers)}")
        codec_rows.append(emb.codec(t([cfg.speakers[name]])))
    codec_rows.append(emb.codec(t([c.pad, c.bos])))
    codec = torch.cat(codec_rows)
    n_tags = codec.shape[0]
    head = torch.cat((tts_pad.expand(n_tags - 2, -1), tts_bos[None])) + codec[:-1]
    rows = [] if not spec.instruct_ids else [emb.text(t(spec.instruct_ids))]
    rows += [emb.text(t(ids[:ROLE_TOKENS])), head]
    text_ids = ids[ROLE_TOKENS:-TAIL_TOKENS]
    if spec.icl:
        if not spec.ref_ids or len(spec.ref_ids) <= ROLE_TOKENS + REF_TAIL_TOKENS:
            raise InvalidRequest("in-context voice cloning needs the reference clip's transcript")
        ref_text = spec.ref_ids[ROLE_TOKENS:-REF_TAIL_TOKENS]
        text = torch.cat((emb.text(t(ref_text + text_ids)), tts_eos[None]))
        frames = torch.cat((emb.codec(t([c.bos])), emb.frames(spec.ref_codes.to(device))))
        if spec.non_streaming:
            rows += [text + emb.codec(t([c.pad] * text.shape[0])), frames + tts_pad]
            trailing = text[:0]
        elif text.shape[0] > frames.shape[0]:
            rows.append(text[: frames.shape[0]] + frames)
            trailing = text[frames.shape[0]:]
        else:
            rows.append(torch.cat((text, tts_pad.expand(frames.shape[0] - text.shape[0], -1))) + frames)
            trailing = text[:0]
    elif spec.non_streaming:
        text = torch.cat((emb.text(t(text_ids)), tts_eos[None]))
        rows += [text + emb.codec(t([c.pad] * text.shape[0])), tts_pad[None] + emb.codec(t([c.bos]))]
        trailing = text[:0]
    else:
        rows.append(emb.text(t(text_ids[:1])) + codec[-1:])
        trailing = torch.cat((emb.text(t(text_ids[1:])), tts_eos[None]))
    prefill = torch.cat(rows)
    positions = torch.arange(prefill.shape[0], dtype=torch.float32).expand(3, -1)
    return TalkerPrompt(prefill, trailing.reshape(-1, prefill.shape[1]), tts_pad, positions)
