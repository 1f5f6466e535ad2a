"""Shared by the Qwen2.5-Omni end-to-end tests (no tests here): transformers' model as the oracle, fed by
transformers' own `Qwen2_5OmniProcessor` (built offline), so omni's preprocessing is under test too."""

from __future__ import annotations

import contextlib
from unittest import mock

import numpy as np

from qwen3_fixtures import IM_END, Oracle, Reference


class Oracle25(Oracle):
    def __init__(self, ckpt_dir) -> None:
        import torch
        from transformers import AutoTokenizer, Qwen2_5OmniForConditionalGeneration

        self.torch = torch
        self.hf = Qwen2_5OmniForConditionalGeneration.from_pretrained(str(ckpt_dir)).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(ckpt_dir))
        self.processor = _hf_processor(self.tokenizer)
        self.codes: list = []
        # token2wav's own parity is tests/test_qwen2_5_token2wav.py: here only the codes it is handed count,
        # and a silent waveform of its length stands in (the DiT's ODE on the CPU is most of a spoken answer)
        dit, hop = self.hf.config.token2wav_config.dit_config, np.prod(self.hf.config.token2wav_config.bigvgan_config.upsample_rates)
        self.hf.token2wav.forward = lambda code, **kw: (self.codes.append(code.clone()),
                                                        torch.zeros(code.shape[1] * dit.repeats * int(hop)))[1]

    def inputs(self, messages) -> dict:
        """As Qwen3-Omni's oracle, with the attention mask the processor gives (transformers' Qwen2.5-Omni
        talker adds its codec pad / bos rows and positions only when `generate` has one)."""
        out = super().inputs(messages)
        out["attention_mask"] = self.torch.ones_like(out["input_ids"])
        return out

    def generate(self, messages, voice: str = "Chelsie", thinker_tokens: int = 12, talker_tokens: int = 40,
                 audio: bool = False, penalty: float = 1.0) -> Reference:
        """Greedy thinker tokens (and with `audio`, the talker's greedy codes, under repetition `penalty`,
        and transformers' waveform)."""
        torch = self.torch
        inputs = self.inputs(messages)
        prompt_len = inputs["input_ids"].shape[1]
        self.codes.clear()
        with torch.no_grad():
            if not audio:
                out = self.hf.thinker.generate(**inputs, max_new_tokens=thinker_tokens, do_sample=False,
                                               eos_token_id=IM_END)
                tokens = out[0, prompt_len:].tolist()
                return Reference(tokens, self.tokenizer.decode(tokens, skip_special_tokens=True), None, None)
            tk = self.hf.config.talker_config
            torch.manual_seed(0)
            seqs, wav = self.hf.generate(**inputs, speaker=voice, thinker_max_new_tokens=thinker_tokens,
                                         thinker_eos_token_id=IM_END, thinker_do_sample=False,
                                         talker_max_new_tokens=talker_tokens, talker_do_sample=False,
                                         talker_repetition_penalty=penalty,
                                         talker_eos_token_id=[tk.tts_codec_pad_token_id, tk.tts_codec_end_token_id])
        tokens = seqs[0, prompt_len:].tolist()
        codes = self.codes[0][0].numpy() if self.codes else None
        return Reference(tokens, self.tokenizer.decode(tokens, skip_special_tokens=True), codes,
                         wav.reshape(-1).float().numpy())


def _hf_processor(tokenizer):
    """transformers' Qwen2.5-Omni processor. Its video processor needs torchvision, so the class check that
    insists on one is bypassed during construction (tests/test_qwen2_5_video.py hands it a stand-in for videos)."""
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import Qwen2_5OmniProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from omni.models.qwen2_5_omni.checkpoint.tiny_presets import PREPROCESSOR_CONFIG as pc

    images = Qwen2VLImageProcessorPil(
        patch_size=pc["patch_size"], merge_size=pc["merge_size"], temporal_patch_size=pc["temporal_patch_size"],
        min_pixels=pc["min_pixels"], max_pixels=pc["max_pixels"], image_mean=pc["image_mean"],
        image_std=pc["image_std"])
    with mock.patch.object(Qwen2_5OmniProcessor, "check_argument_for_proper_class", lambda self, name, arg: None):
        return Qwen2_5OmniProcessor(image_processor=images, video_processor=None,
                                    feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tokenizer,
                                    chat_template=tokenizer.chat_template)


@contextlib.contextmanager
def served_tiny(preset: str, loop, tmp_path_factory):
    """A tiny Qwen2.5-Omni of `preset` served inline (a short ODE: the audio's length counts in tests):
    (checkpoint path, graph info, running kernel)."""
    from omni.models.qwen2_5_omni.checkpoint.make_tiny import make_tiny
    from omni.models.qwen2_5_omni.graph import build
    from qwen3_fixtures import RunningKernel, expose_codes

    path = str(make_tiny(tmp_path_factory.mktemp(preset), seed=0, preset=preset))
    graph, info = build(path, stage_args={"token2wav": {"num_steps": 2}})
    with RunningKernel(loop, expose_codes(graph), mode="inline") as kernel:
        yield path, info, kernel
