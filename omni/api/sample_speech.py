"""`omnid sample-speech FILE`: write a short real English sentence (bundled, 2.85 s) to FILE, so a
first transcription request has speech to send without a microphone or a download."""

from __future__ import annotations

import argparse
from pathlib import Path

SAMPLE = Path(__file__).parent / "samples" / "speech.flac"
SENTENCE = "The birch canoe slid on the smooth planks."
_FORMATS = {".wav": ("WAV", "PCM_16"), ".flac": ("FLAC", "PCM_16"), ".ogg": ("OGG", "OPUS"), ".mp3": ("MP3", None)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="omnid sample-speech",
                                     description=f"write the bundled clip of {SENTENCE!r} (16 kHz mono) to FILE")
    parser.add_argument("file", metavar="FILE", help="where to write it; the suffix picks the format: "
                                                     + ", ".join(_FORMATS))
    path = Path(parser.parse_args(argv).file)
    if path.suffix.lower() not in _FORMATS:
        parser.error(f"FILE must end in one of {', '.join(_FORMATS)}")
    import soundfile as sf

    pcm, rate = sf.read(str(SAMPLE), dtype="float32")
    major, subtype = _FORMATS[path.suffix.lower()]
    sf.write(str(path), pcm, rate, format=major, **({"subtype": subtype} if subtype else {}))
    print(f"omnid: wrote {len(pcm) / rate:.2f} s of speech ({SENTENCE!r}) to {path}", flush=True)
    return 0
