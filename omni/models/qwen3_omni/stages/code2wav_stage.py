"""The vocoder stage of a Qwen3-Omni graph: code2wav under omni's generic streaming vocoder stage."""

from __future__ import annotations

import logging
import time
from functools import partial

import torch

from omni.models.loading import load_part
from omni.models.qwen3_omni.checkpoint.random_load import random_part
from omni.models.qwen3_omni.modules.code2wav import Code2Wav
from omni.models.qwen3_omni.stages.args import Code2WavArgs
from omni.stages.vocoder import VocoderStage

log = logging.getLogger("omni.qwen3.code2wav")


class Code2WavStage(VocoderStage):
    """The vocoder stage of a Qwen3-Omni graph. args: `Code2WavArgs` (stages/args.py)."""

    Args = Code2WavArgs

    def setup(self) -> None:
        super().setup()
        if self.on_gpu:  # first chunks and steady chunks at a few batch sizes: no request pays the kernels' first use
            self.warm_up()

    def warm_up(self, batches: tuple[int, ...] = (1, 4, 16)) -> None:
        codec, t0 = self.codec, time.monotonic()
        for b in batches:
            streams = [codec.new_stream() for _ in range(b)]
            for frames in (self.first_chunk, self.chunk, self.chunk):
                codes = torch.zeros(b, frames, codec.num_groups, dtype=torch.long, device=codec.device)
                codec.decode_frames(codes, streams).cpu()
        log.info("code2wav: warm-up chunks at batch %s in %.1f s", list(batches), time.monotonic() - t0)

    def build_codec(self) -> Code2Wav:
        return load_part(Code2Wav, self.ctx.args, self.ctx.device, random=partial(random_part, "code2wav"))
