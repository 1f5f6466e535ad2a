"""`PreprocessStage` of a Qwen3-Omni graph: the shared entry stage (omni/stages/multimodal/preprocess_stage.py)
with Qwen3-Omni's `Preprocessor`, its audio cut into the encoder's attention windows, and the encode task.

- port `audio`: one chunk per attention window of each input audio {"features": [mel, frames]
  float32, "pad_len": int} (`pad_len` is the clip's own longest chunk: each clip is encoded as if it
  came alone, so its rows are the same in every request that holds it, see clip_features.py; a
  window is encoded on its own, see `window_spans`, so the encoder's cache can hold a clip's windows
  before the clip has ended).

The encode task (request.py `ENCODE`, a clip still being spoken) sends only the windows whose every
frame is final (their samples all arrived) and an empty prompt: the thinker ends it at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omni.kernel.stage import Emit
from omni.stages.multimodal.preprocess_stage import PreprocessStage as SharedPreprocessStage

__all__ = ["PreprocessStage"]


class PreprocessStage(SharedPreprocessStage):
    def preprocessor(self):
        from omni.models.qwen3_omni.stages.preprocess import Preprocessor

        return Preprocessor(self.ctx.args.model_dir)

    def audio_emits(self, rid: str, features: np.ndarray) -> list[Emit]:
        from omni.models.qwen3_omni.modules.audio_encoder import default_pad_len

        return self._windows(rid, features, default_pad_len([features.shape[1]], self.pre.n_window))

    def encode_windows(self, rid: str, messages: list[dict[str, Any]]) -> list[Emit]:
        """A clip still being spoken: its windows whose frames are all final, then an empty prompt."""
        from omni.models.qwen3_omni.modules.audio_encoder import default_pad_len

        pcm = _pcm16k(messages[0]["content"][0]["audio"])
        features = self.pre.clip_features(pcm, remember=False)
        fx = self.pre.feature_extractor
        final = (len(pcm) - fx.n_fft // 2) // fx.hop_length  # frames whose samples all arrived
        window = self.pre.window_frames
        emits = []
        if final >= window:  # the clip is at least a window long: its pad_len is a whole chunk
            pad_len = default_pad_len([features.shape[1]], self.pre.n_window)
            emits = self._windows(rid, features[:, : final // window * window], pad_len)
        return emits + [Emit(rid, "prompt", {"token_ids": np.zeros(0, np.int64)}, finish=True)]

    def _windows(self, rid: str, features: np.ndarray, pad_len: int) -> list[Emit]:
        from omni.models.qwen3_omni.modules.audio_encoder import window_spans

        spans = window_spans(features.shape[1], pad_len, self.pre.n_window, self.pre.n_window_infer)
        return [Emit(rid, "audio", {"features": np.ascontiguousarray(features[:, a:b]), "pad_len": pad_len})
                for a, b in spans]


def _pcm16k(audio: dict[str, Any]) -> np.ndarray:
    from omni.stages.multimodal.preprocess import _audio_pcm

    return _audio_pcm(audio)
