"""Shared by the Qwen3-Omni end-to-end tests and benchmark (no tests here).

- `Oracle`: a tiny checkpoint in transformers, fed by transformers' own processor (not omni's
  preprocessing), and the references its `generate` gives: thinker tokens, the codec codes it hands
  to code2wav (all groups), the waveform.
- `LoopThread` / `RunningKernel`: an omni kernel (multi-process) on an event loop of its own, so
  module-scoped fixtures reuse one kernel across tests and plain test functions call it.
- The prompts (text-only, audio input, image input) in omnid's request-params contract.
"""

from __future__ import annotations

import asyncio
import io
import threading
from dataclasses import dataclass
from typing import Any
from unittest import mock

import numpy as np

from omni.kernel.graph import OUT, EdgeSpec, Graph
from omni.kernel.kernel import Kernel
from omni.models.qwen3_omni.checkpoint.make_tiny import PREPROCESSOR_CONFIG
from omni.layers.tokenizer_offline import token_ids

IM_END = token_ids()["<|im_end|>"]
THREADS_ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}  # as the test process


# ---- prompts -----------------------------------------------------------------------------

def tone_pcm(seconds: float, seed: int, rate: int = 16000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 330 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def png_bytes(height: int, width: int, seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray((rng.random((height, width, 3)) * 255).astype(np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def audio_part(pcm: np.ndarray, rate: int = 16000) -> dict[str, Any]:
    return {"type": "audio", "pcm": np.ascontiguousarray(pcm, dtype="<f4").tobytes(), "sample_rate": rate}


def prompts() -> dict[str, list[dict[str, Any]]]:
    """Chat messages in the params contract: text only, with an audio, with an image, with two audios
    (one longer than an encoder chunk: they pad together) and with two images of different sizes."""
    return {
        "text": [{"role": "system", "content": "be brief"},
                 {"role": "user", "content": "hello there, how are you today?"}],
        "audio": [{"role": "user", "content": [audio_part(tone_pcm(1.3, 1)),
                                               {"type": "text", "text": "what is this sound?"}]}],
        "image": [{"role": "user", "content": [{"type": "image", "data": png_bytes(40, 56, 2)},
                                               {"type": "text", "text": "describe the picture"}]}],
        # transformers' talker cannot take audio and images in one prompt (its rope index then reads a
        # config field the talker lacks), so several audios and several images come in separate prompts
        "audios": [{"role": "system", "content": "you hear"},
                   {"role": "user", "content": [audio_part(tone_pcm(2.3, 3)), {"type": "text", "text": "and then"},
                                                audio_part(tone_pcm(0.4, 6))]}],
        "images": [{"role": "user", "content": [{"type": "image", "data": png_bytes(30, 70, 4)},
                                                {"type": "text", "text": "and then"},
                                                {"type": "image", "data": png_bytes(64, 64, 5)}]}],
    }


def params(messages, voice: str | None = "ethan", thinker_tokens: int = 12, talker_tokens: int = 40,
           modalities: tuple[str, ...] = ("text", "audio"), **thinker: Any) -> dict[str, Any]:
    """Greedy request params (temperature 0 for thinker and talker)."""
    return {"task": "chat", "messages": messages, "modalities": list(modalities), "voice": voice,
            "sampling": {"thinker": {"temperature": 0, "max_tokens": thinker_tokens, **thinker},
                         "talker": {"temperature": 0, "max_tokens": talker_tokens}}}


# ---- the transformers oracle ---------------------------------------------------------------

@dataclass
class Reference:
    tokens: list[int]  # generated thinker ids (EOS included when sampled)
    text: str
    codes: np.ndarray | None  # [frames, groups]
    wav: np.ndarray | None  # float32 [samples]


class Oracle:
    def __init__(self, ckpt_dir) -> None:
        import torch
        from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

        self.torch = torch
        self.hf = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(ckpt_dir)).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(ckpt_dir))
        self.processor = _hf_processor(self.tokenizer)
        self._codes: list = []
        c2w, forward = self.hf.code2wav, self.hf.code2wav.forward
        c2w.forward = lambda codes, **kw: (self._codes.append(codes.clone()), forward(codes, **kw))[1]

    def inputs(self, messages) -> dict[str, Any]:
        """transformers' processor on the request's messages."""
        from PIL import Image

        template, audios, images = [], [], []
        for m in messages:
            content = m["content"]
            if isinstance(content, str):
                template.append(m)
                continue
            parts = []
            for c in content:
                if c["type"] == "audio":
                    audios.append(np.frombuffer(c["pcm"], dtype="<f4"))
                elif c["type"] == "image":
                    images.append(Image.open(io.BytesIO(c["data"])).convert("RGB"))
                parts.append({"type": c["type"], **({"text": c["text"]} if c["type"] == "text" else {})})
            template.append({"role": m["role"], "content": parts})
        text = self.tokenizer.apply_chat_template(template, tokenize=False, add_generation_prompt=True)
        out = self.processor(text=[text], audio=audios or None, images=images or None, return_tensors="pt")
        return {k: v for k, v in out.items() if k != "attention_mask"}

    def generate(self, messages, voice: str = "ethan", thinker_tokens: int = 12, talker_tokens: int = 40,
                 audio: bool = True) -> Reference:
        torch = self.torch
        inputs = self.inputs(messages)
        prompt_len = inputs["input_ids"].shape[1]
        self._codes.clear()
        with torch.no_grad():
            out = self.hf.generate(**inputs, speaker=voice, return_audio=audio, thinker_max_new_tokens=thinker_tokens,
                                   thinker_eos_token_id=IM_END, thinker_do_sample=False,
                                   talker_max_new_tokens=talker_tokens, talker_do_sample=False)
        sequences, wav = (out if audio else (out, None))
        sequences = sequences.sequences if hasattr(sequences, "sequences") else sequences
        tokens = sequences[0, prompt_len:].tolist()
        codes = None
        if audio:
            assert len(self._codes) == 1, "more than one code2wav chunk: keep talker_tokens under 300"
            codes = self._codes[0][0].T.numpy()
        return Reference(tokens, self.tokenizer.decode(tokens, skip_special_tokens=True), codes,
                         None if wav is None else wav.reshape(-1).float().numpy())


def _hf_processor(tokenizer):
    """transformers' Qwen3-Omni processor. Its video processor needs torchvision, so the class check
    that insists on one is bypassed during construction; videos are never passed."""
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

    pc = PREPROCESSOR_CONFIG
    images = Qwen2VLImageProcessorPil(
        patch_size=pc["patch_size"], merge_size=pc["merge_size"], temporal_patch_size=pc["temporal_patch_size"],
        min_pixels=pc["min_pixels"], max_pixels=pc["max_pixels"], image_mean=pc["image_mean"],
        image_std=pc["image_std"])
    with mock.patch.object(Qwen3OmniMoeProcessor, "check_argument_for_proper_class", lambda self, name, arg: None):
        return Qwen3OmniMoeProcessor(image_processor=images, video_processor=None,
                                     feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tokenizer,
                                     chat_template=tokenizer.chat_template)


# ---- omni, through the kernel ----------------------------------------------------------------

@dataclass
class Result:
    tokens: list[int]
    text: str
    pcm: np.ndarray
    codes: np.ndarray | None
    final: dict[str, Any] | None
    audio_events: int = 0


def summarize(events) -> Result:
    tokens = [t for e in events if e.port == "text" for t in e.data["token_ids"]]
    text = "".join(e.data.get("text", "") for e in events if e.port == "text")
    pcm = [np.asarray(e.data["pcm"], dtype=np.float32) for e in events if e.port == "audio"]
    codes = [np.asarray(e.data["codes"]) for e in events if e.port == "codes"]
    final = next((e.data for e in events if e.final), None)
    return Result(tokens, text, np.concatenate(pcm) if pcm else np.zeros(0, np.float32),
                  np.concatenate(codes) if codes else None, final, len(pcm))


def expose_codes(graph: Graph) -> Graph:
    """Let the talker's codes reach the client too (for comparing them with transformers')."""
    if any(s.name == "talker" for s in graph.stages):
        graph.edges.append(EdgeSpec("talker", "codes", OUT))
    return graph


class LoopThread:
    """An event loop in a daemon thread; `run(coro)` waits for the result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 120.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class RunningKernel:
    """`with RunningKernel(loop, graph) as k:` -> k.one(params), k.many([...]), k.stats()."""

    def __init__(self, loop: LoopThread, graph: Graph, mode: str = "process") -> None:
        self.loop = loop
        self.kernel = Kernel(graph, mode=mode, env=dict(THREADS_ENV))

    def __enter__(self) -> RunningKernel:
        self.loop.run(self.kernel.start())
        return self

    def __exit__(self, *exc) -> None:
        self.loop.run(self.kernel.stop())

    async def _one(self, p: dict[str, Any]) -> Result:
        return summarize(await self.kernel.submit(p).collect())

    def one(self, p: dict[str, Any]) -> Result:
        return self.loop.run(self._one(p))

    def many(self, ps: list[dict[str, Any]]) -> list[Result]:
        async def together():
            return await asyncio.gather(*(self._one(p) for p in ps))

        return self.loop.run(together())

    def stats(self) -> dict[str, dict[str, Any]]:
        return self.loop.run(self.kernel.stats())
