"""The Qwen3-TTS reference (`qwen-tts-hf`'s `qwen_tts` package), imported for tests and benchmarks.

`qwen_tts` imports its 25 Hz tokenizer at package import, which needs `sox`, `onnxruntime` and
`torchaudio`; 12 Hz checkpoints (the only ones omni serves) never run that code, so absent
modules are replaced by empty stand-ins that fail loudly if anything calls them. librosa (the
speaker encoder's mel filters) and einops are real dependencies (a benchmark machine without
librosa may take omni's equal mel filters instead: OMNI_REFERENCE_MEL=omni). The hub is off: every load is
from a local folder.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types

STAND_INS = ("sox", "onnxruntime", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi")


class _Absent(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"{self.__name__}.{name}: only the 25 Hz Qwen3-TTS tokenizer uses this module, "
                           f"and it is not installed")


def load():
    """The `qwen_tts` package (None when qwen-tts-hf, librosa or einops is not installed)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for dep in ("qwen_tts", "einops"):
        if importlib.util.find_spec(dep) is None:
            return None
    if importlib.util.find_spec("librosa") is None:
        if os.environ.get("OMNI_REFERENCE_MEL") != "omni":
            return None
        _librosa_mel_stand_in()
    from transformers.utils import import_utils

    import_utils.is_torchaudio_available()  # cached before the stand-ins exist: transformers sees no torchaudio
    for name in STAND_INS:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except ImportError:
                stand_in = _Absent(name)
                stand_in.__spec__ = importlib.machinery.ModuleSpec(name, None)
                sys.modules[name] = stand_in
    if "torchaudio.compliance" in sys.modules and isinstance(sys.modules["torchaudio"], _Absent):
        sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
        sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]
    import qwen_tts

    _cache_rename_compat()
    import qwen3_tts_reference_compat  # the 12 Hz tokenizer's glue for transformers 5.17 .. 5.24

    qwen3_tts_reference_compat.patch()
    return qwen_tts


def _librosa_mel_stand_in() -> None:
    """Where librosa cannot be installed (the H200 image, a benchmark only: OMNI_REFERENCE_MEL=omni),
    the reference's one use of it, `librosa.filters.mel`, comes from omni's Slaney filters (equal to
    librosa's, tests/test_qwen3_tts_tokenizer.py)."""
    from omni.layers.mel import mel_filters

    librosa = _Absent("librosa")
    librosa.__spec__ = importlib.machinery.ModuleSpec("librosa", None)
    filters = types.ModuleType("librosa.filters")
    filters.mel = lambda *, sr, n_fft, n_mels, fmin=0.0, fmax=None, **_: mel_filters(
        n_mels, n_fft, sr, fmin, fmax).T.astype("float32")
    librosa.filters = filters
    sys.modules["librosa"], sys.modules["librosa.filters"] = librosa, filters


def _cache_rename_compat() -> None:
    """transformers 5.24 renamed the generation cache `past_key_values` -> `cache` (in `generate`'s
    model kwargs and in every ModelOutput's __init__); the reference still names it
    `past_key_values`. Translate at its boundary: its forwards take `cache`, its outputs hold it
    under both names. A no-op on a transformers that has no `cache` rename."""
    import functools

    from transformers.utils import generic

    if not hasattr(generic, "_rename_kwargs_for_bc"):
        return
    from qwen_tts.core.models import modeling_qwen3_tts as m

    if getattr(m, "_omni_cache_compat", False):
        return
    for cls in (m.Qwen3TTSTalkerForConditionalGeneration, m.Qwen3TTSTalkerCodePredictorModelForConditionalGeneration):
        forward = cls.forward

        @functools.wraps(forward)
        def wrapped(self, *args, _forward=forward, **kwargs):
            if "cache" in kwargs:
                kwargs["past_key_values"] = kwargs.pop("cache")
            return _forward(self, *args, **kwargs)

        cls.forward = wrapped
    for cls in (m.Qwen3TTSTalkerOutputWithPast, m.Qwen3TTSTalkerCodePredictorOutputWithPast):
        init = getattr(cls.__init__, "__wrapped__", cls.__init__)

        def new_init(self, *args, _init=init, **kwargs):
            cache = kwargs.pop("cache", None)
            passed = kwargs.pop("past_key_values", None)  # 5.25 passes it under its old name as well
            cache = passed if cache is None else cache
            _init(self, *args, past_key_values=cache, **kwargs)
            if cache is not None:
                self["cache"] = cache

        cls.__init__ = new_init  # the metaclass wraps it with the rename again: `cache` arrives here
    m._omni_cache_compat = True
