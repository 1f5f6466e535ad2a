"""The streaming codec decoder (codes -> PCM) every family with a causal codec shares: its causal
layers (`streaming_layers`), the sliding-window pre-transformer (`pre_transformer`) and the
decoder base with its per-stream state (`wave_decoder`); a family adds only its code embedding."""
