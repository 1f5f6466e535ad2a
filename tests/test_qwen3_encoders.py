"""Preprocessing and the audio / vision encoders against transformers' Qwen3-Omni."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import StageContext
from omni.models.qwen3_omni.modules.audio_encoder import AudioEncoder, AudioFeaturesEncoder
from omni.models.qwen3_omni.stages.encoders import AudioEncoderStage, VisionEncoderStage
from omni.layers.image_patches import image_to_patches
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.stages.preprocess import Preprocessor, audio_token_count, resample
from omni.models.qwen3_omni.checkpoint.tiny_presets import PRESETS
from omni.models.qwen3_omni.modules.vision_encoder import ImagePatchesEncoder, VisionEncoder


@pytest.fixture(scope="module", params=sorted(PRESETS))
def ckpt(request, tmp_path_factory):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    path = make_tiny(tmp_path_factory.mktemp(request.param), seed=2, preset=request.param)
    thinker = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(path)).thinker.eval()
    return path, thinker, Preprocessor(path)


def _hf_processor(path, monkeypatch):
    """transformers' own Qwen3-Omni processor. Its video processor needs torchvision, so the
    class check that insists on one is bypassed; videos are never passed."""
    from transformers import AutoTokenizer, WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

    from omni.models.qwen3_omni.checkpoint.make_tiny import PREPROCESSOR_CONFIG as pc

    monkeypatch.setattr(Qwen3OmniMoeProcessor, "check_argument_for_proper_class", lambda self, name, arg: None)
    tok = AutoTokenizer.from_pretrained(str(path))
    images = Qwen2VLImageProcessorPil(
        patch_size=pc["patch_size"], merge_size=pc["merge_size"], temporal_patch_size=pc["temporal_patch_size"],
        min_pixels=pc["min_pixels"], max_pixels=pc["max_pixels"], image_mean=pc["image_mean"],
        image_std=pc["image_std"])
    return Qwen3OmniMoeProcessor(image_processor=images, video_processor=None,
                                 feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tok,
                                 chat_template=tok.chat_template)


def _media(seed: int):
    rng = np.random.default_rng(seed)
    audios = [(rng.standard_normal(n) * 0.1).astype(np.float32) for n in (16000 * 2 + 777, 4100)]
    images = [(rng.random((h, w, 3)) * 255).astype(np.uint8) for h, w in ((50, 70), (140, 41))]
    return audios, images


def _png(array: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def test_preprocess_equals_transformers_processor(ckpt, monkeypatch):
    path, _, pre = ckpt
    hf = _hf_processor(path, monkeypatch)
    audios, images = _media(0)
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [
            {"type": "audio", "audio": {"pcm": audios[0], "sample_rate": 16000}},
            {"type": "image", "image": _png(images[0])},
            {"type": "text", "text": "and this?"},
            {"type": "image", "image": images[1]},
            {"type": "audio", "audio": audios[1]},
        ]},
    ]
    ours = pre(messages)
    text = hf.tokenizer.apply_chat_template(
        [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else
          [{"type": c["type"], **({"text": c["text"]} if c["type"] == "text" else {})} for c in m["content"]]}
         for m in messages], tokenize=False, add_generation_prompt=True)
    ref = hf(text=[text], audio=audios, images=images, return_tensors="np")
    assert ours.input_ids.tolist() == ref["input_ids"][0].tolist()
    # each clip as the processor makes it for a request of that clip alone (test_audio_per_clip.py)
    for i, audio in enumerate(audios):
        alone = hf.feature_extractor([audio], sampling_rate=16000, padding=True, return_attention_mask=True,
                                     return_tensors="np")
        n = int(alone["attention_mask"].sum())
        np.testing.assert_array_equal(ours.audio_features[i], alone["input_features"][0, :, :n])
    lengths = ref["feature_attention_mask"].sum(-1)
    assert ours.audio_feature_lengths[0] == lengths[0]  # the longest clip: the same in the batch
    np.testing.assert_array_equal(ours.image_grid_thw, ref["image_grid_thw"])
    np.testing.assert_allclose(ours.pixel_values, ref["pixel_values"], rtol=0, atol=1e-6)
    # transformers' thinker accepts the inputs: placeholder counts equal the encoders' outputs
    _, thinker, _ = ckpt
    with torch.no_grad():
        mask = np.zeros((len(lengths), ref["input_features"].shape[-1]), dtype=np.int64)
        for i, n in enumerate(lengths):
            mask[i, :n] = 1
        out = thinker(input_ids=torch.from_numpy(ours.input_ids)[None],
                      input_features=torch.from_numpy(ref["input_features"]),
                      feature_attention_mask=torch.from_numpy(mask),
                      pixel_values=torch.from_numpy(ours.pixel_values),
                      image_grid_thw=torch.from_numpy(ours.image_grid_thw))
    assert out.logits.shape[1] == len(ours.input_ids)


def test_preprocess_text_only_and_errors(ckpt):
    path, _, pre = ckpt
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    messages = [{"role": "user", "content": "hello there"}]
    expected = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
    assert pre(messages).input_ids.tolist() == list(expected)
    with pytest.raises(InvalidRequest):
        pre([{"role": "user", "content": [{"type": "video", "video": b""}]}])
    with pytest.raises(InvalidRequest):
        pre([{"role": "user", "content": [{"type": "image", "image": b"not an image"}]}])
    with pytest.raises(InvalidRequest):
        pre([{"role": "user", "content": [{"type": "audio", "audio": np.zeros(0, np.float32)}]}])


def test_audio_token_count_matches_processor_formula():
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

    for n in [1, 2, 7, 99, 100, 101, 199, 200, 257, 1000, 3001]:
        assert audio_token_count(n) == int(_get_feat_extract_output_lengths(np.array(n)))


def test_resample_keeps_pitch_and_duration():
    t = np.arange(24000) / 24000
    tone = np.sin(2 * np.pi * 440 * t).astype(np.float32)
    out = resample(tone, 24000, 16000)
    assert len(out) == 16000
    assert np.argmax(np.abs(np.fft.rfft(out))) == 440  # 1 s clip: bin index = Hz


def test_audio_encoder_matches_transformers(ckpt):
    path, thinker, pre = ckpt
    audios, _ = _media(1)
    audios.append((np.random.default_rng(3).standard_normal(16000 * 9) * 0.1).astype(np.float32))
    feats = pre.audio_features(audios)
    lengths = [f.shape[1] for f in feats]
    padded = np.zeros((len(feats), 128, max(lengths)), np.float32)
    mask = np.zeros((len(feats), max(lengths)), np.int64)
    for i, f in enumerate(feats):
        padded[i, :, :f.shape[1]], mask[i, :f.shape[1]] = f, 1
    with torch.no_grad():
        ref = thinker.get_audio_features(torch.from_numpy(padded), feature_attention_mask=torch.from_numpy(mask))
    ref = ref.last_hidden_state
    enc = AudioEncoder.from_checkpoint(path)
    ours = enc([torch.from_numpy(f) for f in feats])
    assert [len(o) for o in ours] == [audio_token_count(n) for n in lengths]
    _close(torch.cat(ours), ref)
    # alone (short audio: transformers pads nothing), and batched with an equal-pad partner
    short = torch.from_numpy(feats[1])
    with torch.no_grad():
        ref_short = thinker.get_audio_features(short[None], feature_attention_mask=torch.ones(1, lengths[1], dtype=torch.long)).last_hidden_state
    _close(enc([short])[0], ref_short)
    alone = enc([torch.from_numpy(feats[0])])[0]
    together = enc([torch.from_numpy(feats[0]), torch.from_numpy(feats[2])])[0]
    _close(alone, together)


def test_vision_encoder_matches_transformers(ckpt):
    path, thinker, pre = ckpt
    _, images = _media(2)
    images.append((np.random.default_rng(5).random((33, 33, 3)) * 255).astype(np.uint8))
    patches = [image_to_patches(im, pre.image_cfg) for im in images]
    pixels = torch.from_numpy(np.concatenate([p.pixels for p in patches]))
    grids = torch.tensor([p.grid_thw for p in patches])
    with torch.no_grad():
        ref = thinker.get_image_features(pixels, image_grid_thw=grids)
    enc = VisionEncoder.from_checkpoint(path)
    ours = enc([torch.from_numpy(p.pixels) for p in patches], [p.grid_thw for p in patches])
    for i, out in enumerate(ours):
        assert len(out.embeds) == patches[i].num_tokens(pre.image_cfg.merge_size)
        _close(out.embeds, ref.pooler_output[i])
        assert len(out.deepstack) == len(ref.deepstack_features)
        for k, layer in enumerate(ref.deepstack_features):
            _close(out.deepstack[k], layer[i])


def _close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    scale = max(1.0, ref.abs().max().item())
    assert (ours - ref).abs().max().item() <= 1e-5 * scale


def _drive(stage, requests: dict[str, list[dict]]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {rid: [] for rid in requests}
    finished = set()
    for rid, items in requests.items():
        stage.open(rid, {})
        for item in items:
            stage.feed(rid, "in", item)
        stage.close_input(rid)
    while stage.has_work():
        for e in stage.step():
            if e.data is not None:
                out[e.rid].append(e.data)
            if e.finish:
                finished.add(e.rid)
    assert finished == set(requests)
    return out


def test_encoder_stages_batch_cache_and_match(ckpt):
    path, _, pre = ckpt
    audios, images = _media(4)
    feats = pre.audio_features([audios[0]]) + pre.audio_features([audios[1]])
    audio_stage = AudioEncoderStage(StageContext(name="audio", args={"model_dir": str(path), "cache_size": 8}))
    audio_stage.setup()
    got = _drive(audio_stage, {"r1": [{"features": feats[0]}], "r2": [{"features": feats[1]}, {"features": feats[0]}]})
    enc = audio_stage.encoder.model
    assert torch.equal(got["r1"][0]["audio_embeds"], got["r2"][1]["audio_embeds"])
    _close(got["r2"][0]["audio_embeds"], enc([torch.from_numpy(feats[1])])[0])
    assert [len(d["audio_embeds"]) for d in got["r2"]] == [audio_token_count(f.shape[1]) for f in (feats[1], feats[0])]
    assert audio_stage.forwards == 2  # the short audio pads differently: its own batch
    again = _drive(audio_stage, {"r3": [{"features": feats[0]}]})
    assert audio_stage.cache_hits == 1 and audio_stage.forwards == 2
    assert torch.equal(again["r3"][0]["audio_embeds"], got["r1"][0]["audio_embeds"])

    patches = [image_to_patches(im, pre.image_cfg) for im in images]
    items = [{"pixels": p.pixels, "grid_thw": np.array(p.grid_thw)} for p in patches]
    vision_stage = VisionEncoderStage(StageContext(name="vision", args={"model_dir": str(path), "max_batch": 8}))
    vision_stage.setup()
    got = _drive(vision_stage, {"a": [items[0]], "b": [items[1], items[0]]})
    assert vision_stage.forwards == 1  # three images of two requests in one forward
    single = vision_stage.encoder.model([torch.from_numpy(patches[1].pixels)], [patches[1].grid_thw])[0]
    _close(got["b"][0]["image_embeds"], single.embeds)
    assert got["b"][0]["image_deepstack"].shape[0] == len(single.deepstack)
    assert got["b"][0]["image_grid_thw"].tolist() == [list(patches[1].grid_thw)]
    with pytest.raises(InvalidRequest):
        vision_stage.open("bad", {})
        vision_stage.feed("bad", "in", {"pixels": patches[0].pixels, "grid_thw": np.array([1, 3, 3])})


def test_encoder_stage_abort_and_empty_request(tmp_path):
    path = make_tiny(tmp_path / "ckpt")
    model = AudioEncoder.from_checkpoint(path)
    stage = AudioEncoderStage(StageContext(name="audio"), encoder=AudioFeaturesEncoder(model))
    stage.open("x", {})
    stage.feed("x", "in", {"features": np.zeros((128, 30), np.float32)})
    assert stage.backlog() == 1
    stage.abort("x")
    assert not stage.has_work() and stage.backlog() == 0
    stage.open("empty", {})
    stage.close_input("empty")
    emits = stage.step()
    assert [(e.rid, e.finish, e.data) for e in emits] == [("empty", True, None)]
    with pytest.raises(InvalidRequest):
        stage.open("y", {})
        stage.feed("y", "in", {"features": np.zeros((64, 30), np.float32)})
    assert isinstance(ImagePatchesEncoder(VisionEncoder.from_checkpoint(path)).batch_key(
        {"pixels": np.zeros((16, 1536), np.float32), "grid_thw": [1, 4, 4]}), str)
