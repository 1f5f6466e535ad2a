"""The user's side of bench/realtime.py: ten short spoken sentences, committed as 24 kHz 16-bit
mono WAVs under bench/data/realtime/ (the H200 has no espeak-ng), trimmed to the speech itself so
that the benchmark knows where each turn's speech ends (it adds the silence around it).

Regenerate (needs espeak-ng):  python bench/realtime_speech.py [--out bench/data/realtime]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

RATE = 24000
DATA = Path(__file__).resolve().parent / "data" / "realtime"
# no commas: a pause inside a sentence must not look like the end of the turn to a short VAD setting
SENTENCES = (
    "Hello can you hear me",
    "What is the weather like today",
    "Tell me a short joke",
    "How far away is the moon",
    "Can you recommend a good book",
    "What time is it in Tokyo",
    "Please remind me to buy milk",
    "Why is the sky blue",
    "How do I make a cup of tea",
    "Thank you that was helpful",
)
_EDGE = 0.02  # of the peak: below it, a sample at either end is silence


def trim(pcm: np.ndarray) -> np.ndarray:
    """The span from the first to the last sample above `_EDGE` of the peak."""
    loud = np.flatnonzero(np.abs(pcm) >= _EDGE * float(np.abs(pcm).max()))
    return pcm[loud[0]:loud[-1] + 1]


def make_utterances(out: Path = DATA, voice: str = "en-us", speed: int = 175) -> list[Path]:
    """espeak-ng speaks each sentence; resampled to 24 kHz, trimmed, written as NN.wav."""
    import soundfile as sf

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from omni.api.media import resample

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, text in enumerate(SENTENCES, 1):
            raw = Path(tmp) / f"{i}.wav"
            subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(raw), text], check=True,
                           capture_output=True, timeout=30)
            pcm, rate = sf.read(str(raw), dtype="float32")
            pcm = trim(resample(pcm, rate, RATE))
            path = out / f"{i:02d}.wav"
            sf.write(str(path), np.clip(pcm, -1, 1), RATE, subtype="PCM_16")
            paths.append(path)
    return paths


def load_utterances(folder: Path = DATA) -> list[bytes]:
    """Each committed WAV as raw pcm16 bytes (24 kHz mono), in order."""
    import soundfile as sf

    out = []
    for path in sorted(folder.glob("*.wav")):
        pcm, rate = sf.read(str(path), dtype="int16")
        if rate != RATE or pcm.ndim != 1:
            raise SystemExit(f"{path}: {rate} Hz, {pcm.ndim} channel(s); want {RATE} Hz mono")
        out.append(pcm.astype("<i2").tobytes())
    if not out:
        raise SystemExit(f"no WAV in {folder}: run python bench/realtime_speech.py")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(DATA))
    for p in make_utterances(Path(ap.parse_args().out)):
        print(p, p.stat().st_size)
