"""Reusable stage kinds: the AR engine (`omni.stages.ar`), encoder batcher, vocoder, preprocess, sink."""
