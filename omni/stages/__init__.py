"""Reusable stage kinds: the AR engine (`omni.stages.ar`), the multi-codebook talker with its code
predictor (`omni.stages.codec_lm`), encoder batcher, vocoder, preprocess, sink."""
