"""A chat request -> the thinker's inputs, as transformers' Qwen3-Omni and Qwen2.5-Omni processors make
them (what differs between the families is their `PromptSpec`).

The chat template puts one `<|audio_pad|>` / `<|image_pad|>` per audio / image (a template that
prints content as one string gets them written in by `chat_template`); each is
expanded to as many tokens as the encoders will output (audio: the conv stack's length per
100-frame chunk; image: grid cells / merge^2). Audio features are Whisper log-mels (128 bins,
16 kHz), each clip on its own (`clip_features`; Qwen2.5-Omni's processor pads every clip to its
30 s window first, `PromptSpec.pad_audio`): a clip's features, and so its encoder rows and
the thinker's prefix-cache keys, do not depend on what else the request holds, so a conversation's
next turn reuses them. Images are patchified by `image_patches`.

Videos (`{"type": "video", "data": file bytes, "audio": {"pcm", "sample_rate"} | absent, "fps": frames
a second | absent}`) are decoded (omni/layers/video_frames.py) and patchified (video_patches.py) for a
family whose `PromptSpec.video_pixels` gives its processor's pixel budget (the others refuse them); a
`<|video_pad|>` becomes t*h*w / merge^2 video tokens, or, when the video comes with its audio track
(use_audio_in_video), `<|audio_start|>` + video and audio tokens interleaved + `<|audio_end|>`, as
transformers' processor writes it: in time order token by token, or with `PromptSpec.seconds_per_chunk`
in chunks (av_interleave.py). The track is one more audio clip, in prompt order, through the audio encoder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from omni.kernel.errors import InvalidRequest
from omni.layers.av_interleave import VIDEO, chunked_pieces
from omni.layers.chat_template import content_format, render_messages
from omni.layers.prompt_splice import splice, with_sentinels
from omni.layers.clip_features import ClipFeatures, log_mel_extractor
from omni.layers.image_patches import ImagePatchConfig, ImagePatches, image_to_patches, smart_resize
from omni.layers.video_patches import DEFAULT_FPS, FpsFrameRule, VideoPatchConfig, VideoPatches, video_to_patches

SAMPLE_RATE = 16000
AUDIO_TYPES = ("audio", "input_audio")
IMAGE_TYPES = ("image", "image_url")
VIDEO_TYPES = ("video", "video_url")
PROCESSOR_POSITIONS_PER_SECOND = 13.0  # Qwen3OmniMoeProcessor's, for the order of interleaved tokens


@dataclass(frozen=True)
class PromptSpec:
    """What a family's processor needs of its checkpoint (read from its config.json by the family)."""

    vocab_size: int
    audio_token_id: int
    image_token_id: int
    video_token_id: int
    num_mel_bins: int
    audio_tokens: Callable[[int], int]  # mel frames -> the audio encoder's rows
    patch_size: int
    spatial_merge_size: int
    temporal_patch_size: int
    n_window: int = 0  # the audio encoder's chunk is 2 * n_window frames
    n_window_infer: int = 0  # its attention window (Qwen3-Omni)
    pad_audio: bool = False  # features as the processor makes them padded to its `chunk_length` window
    video_pixels: tuple[int, int] | None = None  # its video processor's (min, max) pixels a frame; None: no video
    positions_per_second: float = PROCESSOR_POSITIONS_PER_SECOND  # M-RoPE time positions a second of video
    seconds_per_chunk: float = 0.0  # > 0: a video's audio interleaves in chunks of this many seconds


@dataclass
class PromptInputs:
    input_ids: np.ndarray  # [n] int64, placeholders expanded
    audio_features: list[np.ndarray] = field(default_factory=list)  # each [128, frames] float32
    images: list[ImagePatches] = field(default_factory=list)
    audio_token_counts: list[int] = field(default_factory=list)
    image_token_counts: list[int] = field(default_factory=list)
    videos: list[Any] = field(default_factory=list)  # each a family's VideoPatches (grid_thw, second_per_grid, ...)
    video_audio: list[int | None] = field(default_factory=list)  # each video's clip in audio_features
    audio_slots: list[int] = field(default_factory=list)  # standalone audios' clips, in prompt order

    @property
    def audio_feature_lengths(self) -> np.ndarray:
        return np.array([f.shape[1] for f in self.audio_features], dtype=np.int64)

    @property
    def pixel_values(self) -> np.ndarray | None:
        return np.concatenate([im.pixels for im in self.images]) if self.images else None

    @property
    def image_grid_thw(self) -> np.ndarray:
        return np.array([im.grid_thw for im in self.images], dtype=np.int64).reshape(-1, 3)


class Preprocessor:
    """Tokenizer + feature extractor + image patcher of one checkpoint; `__call__` is pure CPU."""

    def __init__(self, ckpt_dir: str | Path, spec: PromptSpec):
        from transformers import AutoTokenizer

        self.spec = spec
        self.tokenizer = AutoTokenizer.from_pretrained(str(ckpt_dir))
        self.content_format = content_format(self.tokenizer.chat_template or "")
        self.placeholders = _placeholders(self.tokenizer)
        self.special_ids = set(self.tokenizer.all_special_ids)
        extra = _read_preprocessor_config(ckpt_dir)
        self.vocab_size = spec.vocab_size
        self.n_window = spec.n_window
        self.n_window_infer = spec.n_window_infer
        self.audio_token_id = spec.audio_token_id
        self.image_token_id = spec.image_token_id
        self.video_token_id = spec.video_token_id
        self.audio_start_id = self.tokenizer.convert_tokens_to_ids(
            str(getattr(self.tokenizer, "audio_bos_token", None) or "<|audio_start|>"))
        self.audio_end_id = self.tokenizer.convert_tokens_to_ids(
            str(getattr(self.tokenizer, "audio_eos_token", None) or "<|audio_end|>"))
        self.positions_per_second = float(extra.get("position_id_per_seconds", spec.positions_per_second))
        self.max_video_tokens = 0  # the thinker's context (PreprocessStage sets it): checked before decoding
        self.feature_extractor = log_mel_extractor(spec.num_mel_bins, SAMPLE_RATE, extra)
        self.clip_features = ClipFeatures(self.feature_extractor, pad_to_window=spec.pad_audio)
        self.image_cfg = ImagePatchConfig(
            patch_size=extra.get("patch_size", spec.patch_size),
            merge_size=extra.get("merge_size", spec.spatial_merge_size),
            temporal_patch_size=extra.get("temporal_patch_size", spec.temporal_patch_size),
            min_pixels=extra.get("min_pixels", (extra.get("size") or {}).get("shortest_edge", 56 * 56)),
            max_pixels=extra.get("max_pixels", (extra.get("size") or {}).get("longest_edge", 28 * 28 * 1280)),
            image_mean=tuple(extra.get("image_mean", (0.5, 0.5, 0.5))),
            image_std=tuple(extra.get("image_std", (0.5, 0.5, 0.5))),
        )
        self.video_cfg = None if spec.video_pixels is None else _video_config(self.image_cfg, extra, spec.video_pixels)
        self.frame_rule = None if self.video_cfg is None else FpsFrameRule(self.video_cfg)

    def __call__(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> PromptInputs:
        messages, answers = with_sentinels(messages)  # earlier answers keep the ids generated
        if any(t >= self.vocab_size for ids in answers for t in ids):
            raise InvalidRequest(f"an assistant message's token_ids must be below the vocabulary size {self.vocab_size}")
        # media placeholders are input-only: an answer that holds one (a random-weight model's) keeps the
        # rest of its ids, or the prompt would ask for media it does not carry
        media = {self.audio_token_id, self.image_token_id, self.video_token_id}
        answers = [[t for t in ids if t not in media] for ids in answers]
        template_messages, clips, images, videos = self._split_media(messages)
        template_messages = render_messages(template_messages, self.content_format, self.placeholders)
        text = self.tokenizer.apply_chat_template(
            template_messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        ids = splice(text, answers, self._tokenize, self.special_ids)
        features = self.audio_features([a for _, a in clips])  # clips: (the video it is the track of, or None; pcm)
        patches = [image_to_patches(im, self.image_cfg) for im in images]
        out = PromptInputs(np.zeros(0, dtype=np.int64), features, patches)
        out.audio_token_counts = [self.spec.audio_tokens(f.shape[1]) for f in features]
        out.image_token_counts = [p.num_tokens(self.image_cfg.merge_size) for p in patches]
        out.audio_slots = [i for i, (owner, _) in enumerate(clips) if owner is None]
        out.video_audio = [next((i for i, (owner, _) in enumerate(clips) if owner == v), None)
                           for v in range(len(videos))]
        out.videos = [self.video_patches(v, fps) for v, fps in videos]
        out.input_ids = self._expand(ids, out)
        return out

    def video_patches(self, video: bytes, fps: float | None = None) -> VideoPatches:
        """A video file's sampled frames as patches (an undecodable file is an InvalidRequest, and so
        is one whose tokens, counted before its frames are decoded, pass `max_video_tokens`); `fps`:
        the request's sampling rate instead of the checkpoint's (the processor's `fps` kwarg)."""
        from omni.layers.video_frames import VideoDecodeError, decode

        if self.video_cfg is None:
            raise InvalidRequest("this model does not take video input")
        try:
            cfg = self.video_cfg if fps is None else replace(self.video_cfg, fps=float(fps))
            rule = self.frame_rule if fps is None else FpsFrameRule(cfg)
            clip = decode(bytes(video), rule, self._check_tokens if self.max_video_tokens else None)
        except VideoDecodeError as exc:
            raise InvalidRequest(f"cannot decode video: {exc}") from None
        return video_to_patches(clip.frames, cfg)

    def _check_tokens(self, frames: int, height: int, width: int) -> None:
        cfg = self.video_cfg
        if not height or not width:
            return  # the container does not say: the prompt's length bound holds after decoding
        h, w = smart_resize(height, width, cfg.patch_size * cfg.merge_size, cfg.min_pixels, cfg.max_pixels)
        grids = -(-frames // cfg.temporal_patch_size)
        tokens = grids * (h // cfg.patch_size) * (w // cfg.patch_size) // cfg.merge_size**2
        if tokens > self.max_video_tokens:
            raise InvalidRequest(f"the video makes {tokens} tokens ({frames} frames at {w}x{h}); the model's "
                                 f"context is {self.max_video_tokens} tokens")

    @property
    def window_frames(self) -> int:
        """Mel frames of one of the audio encoder's attention windows (audio_encoder.window_spans)."""
        chunk = 2 * self.n_window
        return max(1, self.n_window_infer // chunk) * chunk

    def _tokenize(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def raw(self, text: str) -> PromptInputs:
        """A text completion's prompt as it is: tokenized without the chat template, no media."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        out = PromptInputs(np.zeros(0, dtype=np.int64))
        out.input_ids = self._expand(ids, out)  # a placeholder token in the text is refused
        return out

    def audio_features(self, audios: list[np.ndarray]) -> list[np.ndarray]:
        """[128, frames] log-mels per audio (16 kHz mono float32 in), each as if it came alone."""
        return [self.clip_features(a) for a in audios]

    def _expand(self, ids: list[int], out: PromptInputs) -> np.ndarray:
        audio_counts = [out.audio_token_counts[i] for i in out.audio_slots]  # the videos' clips are not in the text
        for token, counts, what in ((self.audio_token_id, audio_counts, "audio"),
                                    (self.image_token_id, out.image_token_counts, "image"),
                                    (self.video_token_id, out.videos, "video")):
            if ids.count(token) != len(counts):
                raise InvalidRequest(f"the prompt has {ids.count(token)} {what} placeholders for {len(counts)} inputs")
        expanded: list[int] = []
        audio_i = image_i = video_i = 0
        for tok in ids:
            if tok == self.audio_token_id:
                expanded += [tok] * audio_counts[audio_i]
                audio_i += 1
            elif tok == self.image_token_id:
                expanded += [tok] * out.image_token_counts[image_i]
                image_i += 1
            elif tok == self.video_token_id:
                expanded += self._video_tokens(out, video_i)
                video_i += 1
            else:
                expanded.append(tok)
        return np.asarray(expanded, dtype=np.int64)

    def _video_tokens(self, out: PromptInputs, v: int) -> list[int]:
        """One video's placeholder, alone or interleaved with its audio (`replace_video_with_audio_token`)."""
        video, clip = out.videos[v], out.video_audio[v]
        merge = self.image_cfg.merge_size
        n_video = video.num_tokens(merge)
        if clip is None:
            return [self.video_token_id] * n_video
        t, h, w = video.grid_thw
        times = np.repeat(np.arange(t), (h // merge) * (w // merge)) * video.second_per_grid * self.positions_per_second
        n_audio, tokens, vi, ai = out.audio_token_counts[clip], [self.audio_start_id], 0, 0
        if self.spec.seconds_per_chunk:
            per_chunk = int(self.positions_per_second * self.spec.seconds_per_chunk)
            for kind, a, b in chunked_pieces(times, n_audio, per_chunk):
                tokens += [self.video_token_id if kind == VIDEO else self.audio_token_id] * (b - a)
            return tokens + [self.audio_end_id]
        while vi < n_video and ai < n_audio:
            if times[vi] <= ai:
                tokens.append(self.video_token_id)
                vi += 1
            else:
                tokens.append(self.audio_token_id)
                ai += 1
        tokens += [self.video_token_id] * (n_video - vi) + [self.audio_token_id] * (n_audio - ai)
        return tokens + [self.audio_end_id]

    def _split_media(self, messages):
        """Messages for the template (media replaced by typed stubs) and the media in order."""
        if not isinstance(messages, list) or not messages:
            raise InvalidRequest("messages must be a non-empty list")
        audios, images, videos, stripped = [], [], [], []
        for message in messages:
            if not isinstance(message, dict) or "role" not in message:
                raise InvalidRequest("each message needs a role")
            content = message.get("content", "")
            if isinstance(content, str):
                stripped.append({"role": message["role"], "content": content})
                continue
            items = []
            for item in content:
                kind = item.get("type")
                if kind == "text":
                    items.append({"type": "text", "text": item.get("text", "")})
                elif kind in AUDIO_TYPES:
                    audios.append((None, _audio_pcm(item.get("audio", item.get(kind)))))
                    items.append({"type": "audio", "audio": "<audio>"})
                elif kind in VIDEO_TYPES:
                    video = item.get("data", item.get(kind))
                    if not isinstance(video, (bytes, bytearray, memoryview)):
                        raise InvalidRequest("video item without the file's bytes")
                    if item.get("audio") is not None:  # its audio track (use_audio_in_video)
                        audios.append((len(videos), _audio_pcm(item["audio"])))
                    videos.append((video, item.get("fps")))
                    items.append({"type": "video", "video": "<video>"})
                elif kind in IMAGE_TYPES:
                    image = item.get("image", item.get(kind))
                    if image is None:
                        raise InvalidRequest("image item without data")
                    images.append(image)
                    items.append({"type": "image", "image": "<image>"})
                else:
                    raise InvalidRequest(f"unsupported content type {kind!r}")
            stripped.append({"role": message["role"], "content": items})
        return stripped, audios, images, videos


def _placeholders(tokenizer) -> dict[str, str]:
    """What the checkpoint's own template writes for one audio / image, for templates that cannot."""
    def token(attr: str, default: str) -> str:
        return str(getattr(tokenizer, attr, None) or default)

    return {"audio": token("audio_bos_token", "<|audio_start|>") + token("audio_token", "<|audio_pad|>")
            + token("audio_eos_token", "<|audio_end|>"),
            "image": token("vision_bos_token", "<|vision_start|>") + token("image_token", "<|image_pad|>")
            + token("vision_eos_token", "<|vision_end|>"),
            "video": token("vision_bos_token", "<|vision_start|>") + token("video_token", "<|video_pad|>")
            + token("vision_eos_token", "<|vision_end|>")}


def _audio_pcm(audio) -> np.ndarray:
    """Accepts {"pcm": float array, "sample_rate": int}, (pcm, rate) or a 16 kHz array."""
    if isinstance(audio, dict):
        pcm, rate = audio.get("pcm"), audio.get("sample_rate", SAMPLE_RATE)
    elif isinstance(audio, tuple) and len(audio) == 2:
        pcm, rate = audio
    else:
        pcm, rate = audio, SAMPLE_RATE
    if pcm is None:
        raise InvalidRequest("audio item without pcm")
    pcm = np.asarray(pcm, dtype=np.float32)
    if pcm.ndim == 2:  # [channels, samples] or [samples, channels]: mix down
        pcm = pcm.mean(axis=0 if pcm.shape[0] < pcm.shape[1] else 1)
    if pcm.ndim != 1 or pcm.size == 0:
        raise InvalidRequest(f"audio must be non-empty mono PCM, got shape {pcm.shape}")
    return resample(pcm, int(rate), SAMPLE_RATE)


def resample(pcm: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Band-limited (FFT) resampling of a whole clip; identity when rates match."""
    if rate <= 0:
        raise InvalidRequest(f"bad sample rate {rate}")
    if rate == target:
        return pcm
    n_out = max(1, round(len(pcm) * target / rate))
    spectrum = np.fft.rfft(pcm.astype(np.float64))
    keep = n_out // 2 + 1
    if keep <= len(spectrum):
        spectrum = spectrum[:keep]
    else:
        spectrum = np.concatenate([spectrum, np.zeros(keep - len(spectrum), dtype=spectrum.dtype)])
    return (np.fft.irfft(spectrum, n=n_out) * (n_out / len(pcm))).astype(np.float32)


def _video_config(image: ImagePatchConfig, extra: dict[str, Any], pixels: tuple[int, int]) -> VideoPatchConfig:
    """The video processor's settings: the checkpoint's `video_*` keys (else the family's processor's)."""
    return VideoPatchConfig(
        patch_size=image.patch_size, merge_size=image.merge_size, temporal_patch_size=image.temporal_patch_size,
        min_pixels=int(extra.get("video_min_pixels", pixels[0])), max_pixels=int(extra.get("video_max_pixels", pixels[1])),
        image_mean=image.image_mean, image_std=image.image_std, fps=float(extra.get("video_fps", DEFAULT_FPS)),
        min_frames=int(extra.get("video_min_frames", 4)), max_frames=int(extra.get("video_max_frames", 768)))


def _read_preprocessor_config(ckpt_dir: str | Path) -> dict[str, Any]:
    path = Path(ckpt_dir) / "preprocessor_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}
