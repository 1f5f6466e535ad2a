#!/usr/bin/env bash
# Pack everything under $OUT into one tarball (the device tool brings back at most 8 files): several
# recipes in one call each write their own files; run this last. Keeps $OUT/*.md small summaries beside it.
# Usage: bash bench/h200/pack.sh NAME   -> $OUT/NAME.tgz (+ the *.md reports, at most 6)
set -uo pipefail
name=${1:-call}
cd "$OUT" || exit 1
tar czf "/tmp/$name.tgz" --exclude "$name.tgz" . && mkdir -p /tmp/keep-md && cp $(ls -1 *.md 2>/dev/null | head -6) /tmp/keep-md/ 2>/dev/null
find "$OUT" -mindepth 1 -delete
mv "/tmp/$name.tgz" "$OUT/" && cp /tmp/keep-md/*.md "$OUT/" 2>/dev/null; rm -rf /tmp/keep-md
ls -la "$OUT"
