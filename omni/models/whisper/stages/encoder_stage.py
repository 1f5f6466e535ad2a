"""The Whisper encoder as the graph's entry stage: request audio -> windows -> batched encoder forwards.

`open` checks the request's audio (typed 4xx errors for empty, non-finite, silent or over-long
input), resamples it to 16 kHz if needed and splits it into <= 30 s windows; the base
`EncoderStage` batches windows of many requests into one forward. Each window leaves as one
chunk on `windows`: {"encoder_out": [frames, d_model], "window", "windows", "offset_s", "duration_s"}
and, for a request with timestamps, its "mel" [n_mels, 3000] (the decoder may seek within it).

args: model_dir, dtype ("float32" default; "float16"/"bfloat16" on GPU), max_audio_s (600),
silence_peak (1e-4: a clip whose loudest sample is below this is refused as silent).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import torch

from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import StageContext
from omni.models.whisper.config import WhisperConfig
from omni.models.whisper.modules.features import SAMPLE_RATE, log_mel, pad_window
from omni.models.whisper.modules.layers import WhisperEncoder
from omni.models.weights import load_into
from omni.models.whisper.stages.args import WhisperEncoderArgs
from omni.models.whisper.stages.windows import split_windows
from omni.stages.encoder import EncoderStage

TASKS = ("transcribe", "translate")


def request_audio(params: dict[str, Any], max_audio_s: float, silence_peak: float) -> np.ndarray:
    """The request's audio as mono float32 at 16 kHz, or InvalidRequest saying what is wrong."""
    task = params.get("task", "transcribe")
    if task not in TASKS:
        raise InvalidRequest(f"Whisper serves tasks {list(TASKS)}, not {task!r}")
    audio = params.get("audio")
    if not isinstance(audio, dict) or not isinstance(audio.get("pcm"), (bytes, bytearray, memoryview)):
        raise InvalidRequest("a transcription needs params['audio'] = {'pcm': float32 bytes, 'sample_rate': int}")
    raw = bytes(audio["pcm"])
    rate = int(audio.get("sample_rate") or SAMPLE_RATE)
    if len(raw) % 4:
        raise InvalidRequest(f"audio pcm is {len(raw)} bytes, not a whole number of float32 samples")
    pcm = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if pcm.size == 0:
        raise InvalidRequest("audio is empty")
    if not np.isfinite(pcm).all():
        raise InvalidRequest("audio holds NaN or infinite samples")
    if not 1000 <= rate <= 384000:
        raise InvalidRequest(f"audio sample_rate {rate} is out of range")
    if pcm.size / rate > max_audio_s:
        raise InvalidRequest(f"audio lasts {pcm.size / rate:.1f} s; this model takes at most {max_audio_s:.0f} s")
    if float(np.abs(pcm).max()) < silence_peak:
        raise InvalidRequest("audio is silent (no sample above -80 dBFS): nothing to transcribe")
    if rate != SAMPLE_RATE:
        import soxr

        pcm = soxr.resample(pcm, rate, SAMPLE_RATE).astype(np.float32)
    return pcm


class WhisperBatchEncoder:
    """log-mel + encoder forward over a batch of windows (all windows share one shape: 30 s)."""

    def __init__(self, model_dir: str, device: str = "cpu", dtype: str = "float32") -> None:
        self.cfg = WhisperConfig.from_dir(model_dir)
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype)
        self.model = WhisperEncoder(self.cfg)
        load_into(self.model, model_dir, "model.encoder", self.dtype, self.device)

    def batch_key(self, item: dict[str, Any]) -> Hashable:
        audio = item.get("audio")
        if not isinstance(audio, np.ndarray) or audio.ndim != 1:
            raise InvalidRequest("a Whisper window must be 1-D float32 audio")
        return "window"

    @torch.inference_mode()
    def encode(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Items with `keep_mel` also return their log-mel (the decoder's timestamp seek needs it)."""
        windows = np.stack([pad_window(item["audio"]) for item in items])
        mel = log_mel(windows, self.cfg.num_mel_bins, self.device)
        hidden = self.encode_mel(mel)
        out = []
        for i, item in enumerate(items):
            extra = {"mel": mel[i].cpu().clone()} if item.get("keep_mel") else {}
            out.append({"encoder_out": hidden[i].clone(), **extra,
                        **{k: v for k, v in item.items() if k not in ("audio", "keep_mel")}})
        return out

    @torch.inference_mode()
    def encode_mel(self, mel: torch.Tensor) -> torch.Tensor:
        """[B, n_mels, 3000] float32 log-mel -> [B, frames, d_model] float32 on the CPU."""
        return self.model(mel.to(self.device, self.dtype)).float().cpu()


class WhisperEncoderStage(EncoderStage):
    """args: `WhisperEncoderArgs` (stages/args.py)."""

    Args = WhisperEncoderArgs

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.max_audio_s = ctx.args.max_audio_s
        self.silence_peak = ctx.args.silence_peak

    def build_encoder(self) -> WhisperBatchEncoder:
        return WhisperBatchEncoder(self.ctx.args.model_dir, self.ctx.device, self.ctx.args.dtype)

    def open(self, rid: str, params: dict[str, Any]) -> None:
        pcm = request_audio(params, self.max_audio_s, self.silence_peak)
        super().open(rid, params)
        windows = split_windows(pcm)
        for w in windows:
            self.feed(rid, "audio", {"audio": pcm[w.start:w.end], "window": w.index, "windows": len(windows),
                                     "offset_s": w.offset_s, "duration_s": w.duration_s,
                                     "keep_mel": bool(params.get("timestamps"))})
