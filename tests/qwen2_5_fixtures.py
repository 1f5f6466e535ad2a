"""Shared by the Qwen2.5-Omni end-to-end tests (no tests here): transformers' model as the oracle, fed by
transformers' own `Qwen2_5OmniProcessor` (built offline), so omni's preprocessing is under test too."""

from __future__ import annotations

from unittest import mock

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
        t2w, forward = self.hf.token2wav, self.hf.token2wav.forward
        t2w.forward = lambda code, **kw: (self.codes.append(code.clone()), forward(code, **kw))[1]

    def generate(self, messages, voice: str = "Chelsie", thinker_tokens: int = 12, talker_tokens: int = 40,
                 audio: bool = False) -> Reference:
        """Greedy thinker tokens (and with `audio`, the talker's greedy codes and transformers' waveform)."""
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
            torch.manual_seed(0)
            seqs, wav = self.hf.generate(**inputs, speaker=voice, thinker_max_new_tokens=thinker_tokens,
                                         thinker_eos_token_id=IM_END, thinker_do_sample=False,
                                         talker_max_new_tokens=talker_tokens, talker_do_sample=False,
                                         talker_repetition_penalty=1.0)
        tokens = seqs[0, prompt_len:].tolist()
        codes = self.codes[0][0].numpy() if self.codes else None
        return Reference(tokens, self.tokenizer.decode(tokens, skip_special_tokens=True), codes,
                         wav.reshape(-1).float().numpy())


def _hf_processor(tokenizer):
    """transformers' Qwen2.5-Omni processor. Its video processor needs torchvision, so the class check that
    insists on one is bypassed during construction; videos are never passed."""
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
