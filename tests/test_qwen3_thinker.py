"""omni's Qwen3-Omni thinker on the AR engine against transformers' thinker: greedy tokens
exactly equal, hidden-state taps within float tolerance, for text, audio, image and video
prompts, batched and chunked, on differently sized tiny random checkpoints."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from omni.kernel.errors import InvalidRequest  # noqa: E402
from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny  # noqa: E402
from omni.layers.moe_routed import grouped_experts, per_expert  # noqa: E402
from omni.models.qwen3_omni.modules.rope import VisionGrid, rope_index  # noqa: E402
from omni.kernel.stage import StageContext  # noqa: E402
from omni.models.qwen3_omni.modules.thinker import Qwen3OmniThinker  # noqa: E402
from omni.models.qwen3_omni.stages.thinker_stage import ThinkerStage  # noqa: E402
from omni.layers.tokenizer_offline import token_ids  # noqa: E402
from omni.stages.ar.config import EngineConfig  # noqa: E402
from omni.stages.ar.engine import AREngine  # noqa: E402
from omni.stages.ar.sequence import SamplingParams  # noqa: E402

IDS = token_ids()
MAX_NEW = 16
IMAGE_GRID = (1, 4, 4)  # 16 patches -> 4 merged tokens
VIDEO_GRID = (2, 4, 4)  # 8 merged tokens


def _chat(*user_parts: list[int]) -> list[int]:
    user = [t for part in user_parts for t in part]
    return [IDS["<|im_start|>"], IDS["user"], 10, *user, IDS["<|im_end|>"], 10, IDS["<|im_start|>"], IDS["assistant"], 10]


def _audio(n: int) -> list[int]:
    return [IDS["<|audio_start|>"], *[IDS["<|audio_pad|>"]] * n, IDS["<|audio_end|>"]]


def _vision(token: str, n: int) -> list[int]:
    return [IDS["<|vision_start|>"], *[IDS[token]] * n, IDS["<|vision_end|>"]]


@pytest.fixture(scope="module", params=["tiny-a", "tiny-b"])
def pair(request, tmp_path_factory):
    ckpt = make_tiny(tmp_path_factory.mktemp(request.param), seed=3, preset=request.param)
    hf = transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(ckpt)).eval()
    return hf, Qwen3OmniThinker.from_checkpoint(ckpt), ckpt


def _cat(x):
    """Encoder outputs come split per item (a tuple) or whole, by transformers version."""
    return torch.cat(list(x)) if isinstance(x, (list, tuple)) else x


def _multimodal_case(hf, seed: int):
    """A prompt with text, audio, an image and a video; inputs for transformers and for omni."""
    g = torch.Generator().manual_seed(seed)
    frames = 180
    features = torch.randn(1, 128, frames, generator=g)
    feature_mask = torch.ones(1, frames, dtype=torch.long)
    patch_dim = 3 * 2 * 16 * 16
    pixels = torch.randn(IMAGE_GRID[0] * IMAGE_GRID[1] * IMAGE_GRID[2], patch_dim, generator=g)
    video = torch.randn(VIDEO_GRID[0] * VIDEO_GRID[1] * VIDEO_GRID[2], patch_dim, generator=g)
    image_thw, video_thw = torch.tensor([IMAGE_GRID]), torch.tensor([VIDEO_GRID])
    seconds = torch.tensor([0.5])
    with torch.no_grad():
        audio_emb = hf.thinker.get_audio_features(features, feature_mask).last_hidden_state
        image = hf.thinker.get_image_features(pixels, image_thw)
        vid = hf.thinker.get_video_features(video, video_thw)
    prompt = _chat(list(b"listen "), _audio(audio_emb.shape[0]), list(b" look "), _vision("<|image_pad|>", 4),
                   list(b" watch"), _vision("<|video_pad|>", 8), list(b"?"))
    hf_kwargs = dict(input_features=features, feature_attention_mask=feature_mask, pixel_values=pixels,
                     image_grid_thw=image_thw, pixel_values_videos=video, video_grid_thw=video_thw,
                     video_second_per_grid=seconds)
    omni_inputs = {
        "audio_embeds": audio_emb.numpy(),
        "image_embeds": _cat(image.pooler_output),
        "image_grid_thw": image_thw,
        "image_deepstack": torch.stack([_cat(f) for f in image.deepstack_features]),
        "video_embeds": _cat(vid.pooler_output),
        "video_grid_thw": video_thw.numpy(),
        "video_second_per_grid": [0.5],
        "video_deepstack": torch.stack([_cat(f) for f in vid.deepstack_features]),
    }
    return prompt, hf_kwargs, omni_inputs


def _reference(hf, prompt, **kwargs):
    with torch.no_grad():
        out = hf.thinker.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=IDS["<|im_end|>"],
            output_hidden_states=True, return_dict_in_generate=True, **kwargs,
        )
    tokens = out.sequences[0, len(prompt) :].tolist()
    hidden = {i: torch.cat([step[i] for step in out.hidden_states], dim=1)[0] for i in range(len(out.hidden_states[0]))}
    return tokens, hidden


def _run(thinker, requests, taps, budget):
    eng = AREngine(thinker, EngineConfig(block_size=4, num_blocks=128, max_model_len=256, max_num_batched_tokens=budget,
                                         tap_layers=taps, eos_token_ids=(IDS["<|im_end|>"],)))
    seqs = [eng.add_request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=MAX_NEW), inputs=inp, return_hidden=True)
            for i, (p, inp) in enumerate(requests)]
    rows = {s.rid: {t: [] for t in taps} for s in seqs}
    while eng.has_unfinished():
        for o in eng.step():
            for t, h in o.taps.items():
                rows[o.rid][t].append(h)
    assert eng.stats()["free_blocks"] == 128
    return [(s.output_token_ids, {t: torch.cat(rows[s.rid][t]) for t in taps}) for s in seqs]


def test_text_and_multimodal_match_transformers(pair):
    hf, thinker, _ = pair
    layers = thinker.cfg.text.num_layers
    accept = hf.config.talker_config.accept_hidden_layer
    taps = tuple(sorted({0, accept, layers}))
    text_a = _chat(list(b"hello there, how are you today?"))
    text_b = _chat(list(b"Name three colours"))
    mm_prompt, hf_kwargs, omni_inputs = _multimodal_case(hf, seed=5)
    cases = [(text_a, {}, {}), (text_b, {}, {}), (mm_prompt, hf_kwargs, omni_inputs)]
    refs = [_reference(hf, p, **kw) for p, kw, _ in cases]
    assert len(set(refs[0][0])) > 3  # varied output: the comparison means something
    # all three together, with prefill chunks that cut through the multimodal runs
    got = _run(thinker, [(p, inp) for p, _, inp in cases], taps, budget=13)
    for (tokens, hidden), (ref_tokens, ref_hidden) in zip(got, refs):
        assert tokens == ref_tokens
        for t in taps:
            assert hidden[t].shape == ref_hidden[t].shape
            torch.testing.assert_close(hidden[t], ref_hidden[t], atol=2e-4, rtol=1e-4)
    # the multimodal request alone, unchunked, gives the same tokens
    assert _run(thinker, [(mm_prompt, omni_inputs)], (0,), budget=256)[0][0] == refs[2][0]


def test_rope_index_matches_transformers(pair):
    hf, thinker, _ = pair
    prompt, kw, _ = _multimodal_case(hf, seed=1)
    ids = torch.tensor([prompt])
    audio_lens = kw["feature_attention_mask"].sum(-1)
    want, want_delta = hf.thinker.get_rope_index(ids, kw["image_grid_thw"], kw["video_grid_thw"], torch.ones_like(ids),
                                                 False, audio_lens, kw["video_second_per_grid"])
    got, delta = rope_index(prompt, thinker.rope_tokens, [VisionGrid(*IMAGE_GRID)], [VisionGrid(*VIDEO_GRID, 0.5)])
    assert torch.equal(got, want[:, 0].float()) and delta == float(want_delta)
    assert (got[0] % 1 != 0).any()  # 0.5 s per video grid step: fractional temporal positions


def test_weights_from_transformers_state_dict_and_bad_inputs(pair):
    hf, thinker, _ = pair
    other = Qwen3OmniThinker(thinker.cfg)
    other.load_weights(hf.state_dict())  # transformers' module names, stacked experts
    for name, tensor in thinker.state_dict().items():
        assert torch.equal(tensor, other.state_dict()[name]), name
    eng = AREngine(thinker, EngineConfig(block_size=4, num_blocks=64, max_model_len=128))
    with pytest.raises(InvalidRequest):
        eng.add_request("a", _chat(_audio(3)), inputs={"audio_embeds": torch.zeros(2, thinker.cfg.text.hidden_size)})
    with pytest.raises(InvalidRequest):
        eng.add_request("b", _chat(_vision("<|image_pad|>", 4)), inputs={
            "image_embeds": torch.zeros(4, thinker.cfg.text.hidden_size), "image_grid_thw": [[1, 4, 8]]})
    with pytest.raises(InvalidRequest):
        eng.add_request("c", _chat(list(b"hi")), inputs={"pixels": [1]})
    assert eng.stats()["waiting"] == 0


def test_moe_grouped_and_per_expert_paths_agree(pair):
    _, thinker, _ = pair
    moe = next(layer.mlp for layer in thinker.model.layers if hasattr(layer.mlp, "experts"))
    x = torch.randn(11, thinker.cfg.text.hidden_size, generator=torch.Generator().manual_seed(0))
    weights, chosen = torch.topk(torch.nn.functional.linear(x, moe.gate.weight).softmax(-1), moe.top_k)
    with torch.no_grad():
        experts = (x, weights, chosen, moe.experts.gate_up_proj, moe.experts.down_proj, moe.act)
        torch.testing.assert_close(grouped_experts(*experts), per_expert(*experts))


def test_thinker_stage_streams_tokens_and_taps(pair):
    hf, _, ckpt = pair
    accept = hf.config.talker_config.accept_hidden_layer
    prompt, hf_kwargs, inputs = _multimodal_case(hf, seed=9)
    ref_tokens, ref_hidden = _reference(hf, prompt, **hf_kwargs)
    ctx = StageContext(name="thinker", args={"model_dir": str(ckpt), "block_size": 4, "num_blocks": 64,
                                             "max_model_len": 128, "max_num_batched_tokens": 8},
                       in_ports=["tokens", "audio", "vision"], out_ports=["text", "hidden"])
    stage = ThinkerStage(ctx)
    stage.setup()
    stage.open("r", {"sampling": {"thinker": {"temperature": 0.0, "max_tokens": MAX_NEW}}})
    stage.feed("r", "tokens", {"token_ids": prompt[:7]})
    stage.feed("r", "audio", {"audio_embeds": inputs["audio_embeds"]})
    for key in ("image", "video"):  # vision outputs arrive one chunk per item
        chunk = {k: v for k, v in inputs.items() if k.startswith(key)}
        stage.feed("r", "vision", chunk)
    stage.feed("r", "tokens", {"token_ids": prompt[7:]})
    stage.close_input("r")
    tokens, layer0, layer_acc, done = [], [], [], False
    while stage.has_work():
        for e in stage.step():
            assert e.error is None
            if e.finish:
                done = True
            elif e.port == "text":
                tokens += e.data["token_ids"]
            else:
                layer0.append(e.data["layer_0"])
                layer_acc.append(e.data[f"layer_{accept}"])
    assert done and tokens == ref_tokens
    assert layer0[0].shape[0] == len(prompt)  # the prompt's rows in one chunk
    torch.testing.assert_close(torch.cat(layer0), ref_hidden[0], atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(torch.cat(layer_acc), ref_hidden[accept], atol=2e-4, rtol=1e-4)


@pytest.mark.gpu
def test_thinker_on_cuda_matches_transformers(pair):
    hf, _, ckpt = pair
    accept = hf.config.talker_config.accept_hidden_layer
    prompt, hf_kwargs, inputs = _multimodal_case(hf, seed=5)
    text = _chat(list(b"hello there, how are you today?"))
    refs = [_reference(hf, text), _reference(hf, prompt, **hf_kwargs)]
    thinker = Qwen3OmniThinker.from_checkpoint(ckpt, device="cuda")
    eng = AREngine(thinker, EngineConfig(block_size=16, num_blocks=32, max_model_len=256, max_num_batched_tokens=24,
                                         tap_layers=(0, accept), eos_token_ids=(IDS["<|im_end|>"],), device="cuda"))
    seqs = [eng.add_request("t", text, SamplingParams(temperature=0.0, max_tokens=MAX_NEW), return_hidden=True),
            eng.add_request("m", prompt, SamplingParams(temperature=0.0, max_tokens=MAX_NEW), inputs=inputs,
                            return_hidden=True)]
    rows = {"t": [], "m": []}
    while eng.has_unfinished():
        for o in eng.step():
            if o.taps:
                rows[o.rid].append(o.taps[accept].cpu())
    for seq, (ref_tokens, ref_hidden) in zip(seqs, refs):
        assert seq.output_token_ids == ref_tokens
        torch.testing.assert_close(torch.cat(rows[seq.rid]), ref_hidden[accept], atol=1e-3, rtol=1e-3)
    bf16 = Qwen3OmniThinker.from_checkpoint(ckpt, device="cuda", dtype=torch.bfloat16)
    eng = AREngine(bf16, EngineConfig(block_size=16, num_blocks=32, max_model_len=256, device="cuda"))
    out = eng.generate([text, text[:9]], SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=8))
    assert [len(o) for o in out] == [8, 8]
