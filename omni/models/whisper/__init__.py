"""Whisper speech recognition: log-mel features, a batched encoder stage, the decoder on the AR engine.

Modules: `config` (dims and special tokens from a Hugging Face checkpoint), `ct2_format` and
`convert_ct2` (CTranslate2 model.bin -> Hugging Face checkpoint), `features` (log-mel), `windows`
(long audio -> <= 30 s windows), `modules` / `decoder` (torch), `logits` (Whisper's decoding rules),
`transcript` (tokens -> text and timed segments), the stages and `graph.build`.
"""
