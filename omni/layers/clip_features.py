"""One audio clip's Whisper log-mels, as transformers' processor makes them for a request that holds
only that clip, with a small LRU keyed by the samples' digest.

Why per clip: the processor pads a request's audios together, and a clip that is not the longest
then gets one frame more (ceil instead of floor of samples / hop) and its chunks pad to the longest
chunk of the request; its numbers would change with each turn of a conversation, and neither the
encoder's cache nor the thinker's prefix cache could reuse them. A request with one audio is exact
against the processor; for several, see tests/test_audio_per_clip.py for the measured difference.
The LRU saves re-extracting a conversation's earlier clips, which every turn re-sends.
`pad_to_window`: the clip padded to the extractor's window first (`padding="max_length"`, as
Qwen2.5-Omni's processor always pads), its valid frames kept.
"""

from __future__ import annotations

from collections import OrderedDict
from hashlib import blake2b

import numpy as np

SAMPLE_RATE = 16000


class ClipFeatures:
    def __init__(self, extractor, max_bytes: int = 64 << 20, pad_to_window: bool = False) -> None:
        self.extractor = extractor
        self.padding = "max_length" if pad_to_window else True
        self.max_bytes = max_bytes
        self._cache: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._bytes = 0
        self.computed = 0  # clips extracted (not served from the cache)

    def __call__(self, pcm: np.ndarray, remember: bool = True) -> np.ndarray:
        """[mel_bins, frames] float32 for 16 kHz mono float32 samples (`remember` False: a clip's
        start, still being spoken, stays out of the cache)."""
        pcm = np.ascontiguousarray(pcm, dtype=np.float32)
        key = blake2b(pcm.tobytes(), digest_size=16).digest()
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        fx = self.extractor([pcm], sampling_rate=SAMPLE_RATE, padding=self.padding, truncation=self.padding == "max_length",
                            return_attention_mask=True, return_tensors="np")
        n = int(fx["attention_mask"][0].sum())
        out = np.ascontiguousarray(fx["input_features"][0, :, :n], dtype=np.float32)
        self.computed += 1
        if remember:
            self._remember(key, out)
        return out

    def _remember(self, key: bytes, features: np.ndarray) -> None:
        if features.nbytes > self.max_bytes:
            return
        self._cache[key] = features
        self._bytes += features.nbytes
        while self._bytes > self.max_bytes:
            _, old = self._cache.popitem(last=False)
            self._bytes -= old.nbytes


def log_mel_extractor(num_mel_bins: int, sampling_rate: int, settings: dict):
    """transformers' Whisper feature extractor (the omni families' audio front end) with a
    checkpoint's preprocessor settings (hop_length, n_fft, chunk_length, dither) where it gives them."""
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(feature_size=num_mel_bins, sampling_rate=sampling_rate,
                                   **{k: settings[k] for k in ("hop_length", "n_fft", "chunk_length", "dither")
                                      if k in settings})
