"""`PreprocessStage` of a Qwen2.5-Omni graph: the shared entry stage (omni/stages/multimodal/preprocess_stage.py)
with Qwen2.5-Omni's numbers. Each audio clip goes whole to the encoder as one chunk {"features"} (its
log-mels as the reference's processor makes them: padded to 30 s, then cut to the clip's frames), each
image as {"pixels", "grid_thw"}. The image items are the seam for video frames: a video's sampled frames,
patchified the same way with t > 1, would go on the same port."""

from __future__ import annotations

from pathlib import Path

from omni.stages.multimodal.preprocess import Preprocessor, PromptSpec
from omni.stages.multimodal.preprocess_stage import PreprocessStage as SharedPreprocessStage
from omni.models.qwen2_5_omni.config import load_omni_config
from omni.models.qwen2_5_omni.modules.audio_encoder import token_count

__all__ = ["PreprocessStage", "preprocessor"]


def prompt_spec(ckpt_dir: str | Path) -> PromptSpec:
    t = load_omni_config(ckpt_dir).thinker
    return PromptSpec(vocab_size=t.text.vocab_size, audio_token_id=t.audio_token_id, image_token_id=t.image_token_id,
                      video_token_id=t.video_token_id, num_mel_bins=t.audio.num_mel_bins, audio_tokens=token_count,
                      patch_size=t.vision.patch_size, spatial_merge_size=t.vision.spatial_merge_size,
                      temporal_patch_size=t.vision.temporal_patch_size, n_window=t.audio.n_window, pad_audio=True)


def preprocessor(ckpt_dir: str | Path) -> Preprocessor:
    return Preprocessor(ckpt_dir, prompt_spec(ckpt_dir))


class PreprocessStage(SharedPreprocessStage):
    def preprocessor(self) -> Preprocessor:
        return preprocessor(self.ctx.args.model_dir)
