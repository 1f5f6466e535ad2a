"""`PreprocessStage` of a Qwen2.5-Omni graph: the shared entry stage (omni/stages/multimodal/preprocess_stage.py)
with Qwen2.5-Omni's numbers. Each audio clip goes whole to the encoder as one chunk {"features"} (its
log-mels as the reference's processor makes them: padded to 30 s, then cut to the clip's frames), each
image as {"pixels", "grid_thw"}, each video as its sampled frames' patches on the same port (t > 1, with
its seconds per grid and audio tokens). Videos are sampled and resized as transformers' Qwen2.5-Omni
processor has its video processor do it (`fps` 2, 128..768 x 28 x 28 pixels a frame unless the
checkpoint's `video_*` keys say otherwise); a video's audio track interleaves with its frames in chunks
of 2 s (the processor's `seconds_per_chunk`, at its 25 positions a second)."""

from __future__ import annotations

from pathlib import Path

from omni.stages.multimodal.preprocess import Preprocessor, PromptSpec
from omni.stages.multimodal.preprocess_stage import PreprocessStage as SharedPreprocessStage
from omni.models.qwen2_5_omni.config import load_omni_config
from omni.models.qwen2_5_omni.modules.audio_encoder import token_count

__all__ = ["PreprocessStage", "preprocessor"]

VIDEO_PIXELS = (128 * 28 * 28, 768 * 28 * 28)  # Qwen2_5OmniProcessor's videos_kwargs size
POSITIONS_PER_SECOND, SECONDS_PER_CHUNK = 25.0, 2.0  # its class defaults (the model's config has its own)


def prompt_spec(ckpt_dir: str | Path) -> PromptSpec:
    t = load_omni_config(ckpt_dir).thinker
    return PromptSpec(vocab_size=t.text.vocab_size, audio_token_id=t.audio_token_id, image_token_id=t.image_token_id,
                      video_token_id=t.video_token_id, num_mel_bins=t.audio.num_mel_bins, audio_tokens=token_count,
                      patch_size=t.vision.patch_size, spatial_merge_size=t.vision.spatial_merge_size,
                      temporal_patch_size=t.vision.temporal_patch_size, n_window=t.audio.n_window, pad_audio=True,
                      video_pixels=VIDEO_PIXELS, positions_per_second=POSITIONS_PER_SECOND,
                      seconds_per_chunk=SECONDS_PER_CHUNK)


def preprocessor(ckpt_dir: str | Path) -> Preprocessor:
    return Preprocessor(ckpt_dir, prompt_spec(ckpt_dir))


class PreprocessStage(SharedPreprocessStage):
    def preprocessor(self) -> Preprocessor:
        return preprocessor(self.ctx.args.model_dir)
