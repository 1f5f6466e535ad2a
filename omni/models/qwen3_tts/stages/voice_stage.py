"""The voice stage of a Qwen3-TTS Base graph: a reference clip -> the voice prompt the talker clones.

A request opens with its voice in its params, one of:
- `voice_ref` {"pcm": f32 LE bytes, "sample_rate", "text"}: a clip (inline, or an upload being
  created): its speaker embedding (speaker encoder) and, with a transcript, its reference codes
  (the speech tokenizer's encoder) are computed here, once;
- `voice_prompt` {"spk_embedding", "ref_codes", "num_frames", "ref_text"} (bytes): a voice computed
  before (the API's voice store): passed on as arrays, nothing computed.
The same inline clip (and transcript) again is answered from a small LRU of prompts, so a client
that sends its clip with every request pays for it once. Without a transcript the voice is x-vector only (no reference codes), as the reference's
`x_vector_only_mode`. The prompt leaves on `voice` (to the talker) for speech, on `voice_prompt`
(to the client) for a voice-creation request (task "voice").

Clips are computed one at a time: both encoders' results depend on a clip's exact length. Both
run in float32 whatever the graph's dtype: codes are nearest-codebook picks, and a bf16 encoder
picks other codes than the reference does (the work is once per voice, so the cost is small). On
CUDA the stage's process also turns TF32 off, for the same reason.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import Emit, Stage, StageContext
from omni.models.qwen3_tts.stages.args import TTSVoiceArgs
from omni.stages.args import coerce_args
from omni.stages.threads import pin_torch_threads

log = logging.getLogger("omni.qwen3_tts.voice")
TOKENIZER_DIR = "speech_tokenizer"
MAX_REF_SECONDS = 60.0
MIN_REF_SECONDS = 0.5
SILENCE_PEAK = 1e-3  # a clip whose loudest sample is below this has no voice to clone


@dataclass
class _Job:
    params: dict[str, Any]
    closed: bool = False


def voice_prompt_arrays(prompt: dict[str, Any], groups: int) -> dict[str, Any]:
    """`voice_prompt` params (bytes) -> the talker's arrays; a malformed one is an InvalidRequest."""
    try:
        emb = np.frombuffer(prompt["spk_embedding"], dtype="<f4").copy()
        raw = prompt.get("ref_codes")
        codes = None
        if raw is not None:
            codes = np.frombuffer(raw, dtype="<i8").copy().reshape(int(prompt["num_frames"]), groups)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRequest(f"voice_prompt is malformed: {exc}") from None
    if not len(emb) or not np.isfinite(emb).all():
        raise InvalidRequest("voice_prompt's speaker embedding is empty or not finite")
    return {"spk_embedding": emb, "ref_codes": codes, "ref_text": prompt.get("ref_text")}


def check_clip(pcm: np.ndarray, rate: int, max_seconds: float = MAX_REF_SECONDS) -> None:
    """The reasons a clip cannot be cloned, as 400s: too short, too long, silent, not finite."""
    seconds = len(pcm) / rate
    if seconds < MIN_REF_SECONDS:
        raise InvalidRequest(f"reference audio is {seconds:.2f} s; at least {MIN_REF_SECONDS} s is needed")
    if seconds > max_seconds:
        raise InvalidRequest(f"reference audio is {seconds:.1f} s; at most {max_seconds:g} s is taken")
    if not np.isfinite(pcm).all():
        raise InvalidRequest("reference audio has non-finite samples")
    if float(np.abs(pcm).max()) < SILENCE_PEAK:
        raise InvalidRequest("reference audio is silent")


class VoiceStage(Stage):
    """args: `TTSVoiceArgs` (stages/args.py)."""

    in_port = "voice"

    def __init__(self, ctx: StageContext) -> None:
        ctx.args = coerce_args(TTSVoiceArgs, ctx.args, ctx.name)
        super().__init__(ctx)
        self.jobs: dict[str, _Job] = {}
        self.max_seconds = ctx.args.max_ref_seconds
        self.speaker = None
        self.tokenizer = None
        self.computed = 0
        self.recent: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.max_recent = ctx.args.recent_clips

    def setup(self) -> None:
        import torch

        from omni.models.qwen3_tts.modules.speaker_encoder import SpeakerEncoder
        from omni.models.qwen3_tts.modules.speech_tokenizer_encoder import SpeechTokenizerEncoder

        pin_torch_threads(self.ctx.args.threads)
        if str(self.ctx.device).startswith("cuda"):
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        model_dir = Path(self.ctx.args.model_dir)
        self.speaker = SpeakerEncoder.from_checkpoint(model_dir, dtype=torch.float32, device=self.ctx.device)
        self.tokenizer = SpeechTokenizerEncoder.from_dir(model_dir / TOKENIZER_DIR, dtype=torch.float32,
                                                         device=self.ctx.device,
                                                         seed=self.ctx.args.seed)

    def open(self, rid: str, params: dict[str, Any]) -> None:
        if params.get("voice_ref") is None and params.get("voice_prompt") is None:
            raise InvalidRequest("a Base (voice cloning) model needs a voice: an uploaded voice or a reference clip")
        self.jobs[rid] = _Job(params)

    def feed(self, rid: str, port: str, data: dict[str, Any]) -> None:
        raise InvalidRequest(f"the voice stage takes its voice from the request, not from port {port!r}")

    def close_input(self, rid: str) -> None:
        self.jobs[rid].closed = True

    def abort(self, rid: str) -> None:
        self.jobs.pop(rid, None)

    def has_work(self) -> bool:
        return any(j.closed for j in self.jobs.values())

    def backlog(self) -> int:
        return len(self.jobs)

    def step(self) -> list[Emit]:
        rid = next((r for r, j in self.jobs.items() if j.closed), None)
        if rid is None:
            return []
        params = self.jobs.pop(rid).params
        port = "voice_prompt" if params.get("task") == "voice" else "voice"
        try:
            prompt = self.prompt(params)
        except InvalidRequest as exc:
            return [Emit(rid, error=str(exc), error_kind=exc.kind)]
        return [Emit(rid, port, prompt, finish=True)]

    def prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        """The request's voice prompt: passed on from `voice_prompt`, else computed from `voice_ref`."""
        if params.get("voice_prompt") is not None:
            return voice_prompt_arrays(params["voice_prompt"], self.tokenizer.num_quantizers)
        return self.compute(params["voice_ref"])

    def compute(self, ref: dict[str, Any]) -> dict[str, Any]:
        try:
            pcm = np.frombuffer(ref["pcm"], dtype="<f4").copy()
            rate = int(ref["sample_rate"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidRequest(f"voice_ref is malformed: {exc}") from None
        if rate != self.tokenizer.sample_rate:
            raise InvalidRequest(f"voice_ref audio must be {self.tokenizer.sample_rate} Hz, got {rate}")
        text = ref.get("text") or None
        key = hashlib.sha1(ref["pcm"] + b"\0" + (text or "").encode()).hexdigest()
        if key in self.recent:
            self.recent.move_to_end(key)
            return self.recent[key]
        check_clip(pcm, rate, self.max_seconds)
        self.computed += 1
        prompt = {"spk_embedding": self.speaker.embed(pcm),
                  "ref_codes": self.tokenizer.encode(pcm) if text else None, "ref_text": text}
        self.recent[key] = prompt
        while len(self.recent) > self.max_recent:
            self.recent.popitem(last=False)
        return prompt

    def stats(self) -> dict[str, Any]:
        return {"pending": len(self.jobs), "computed": self.computed}
