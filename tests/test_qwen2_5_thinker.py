"""omni's Qwen2.5-Omni thinker (its audio encoder, vision encoder and LM on the AR engine, each built
through omni's own loader) against transformers' `Qwen2_5OmniForConditionalGeneration`: greedy tokens
exactly equal for text, audio and image prompts, all requests batched in one engine, on two tiny random
checkpoints of different shapes; the encoders' rows within float tolerance of the reference's."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from omni.kernel.errors import InvalidRequest  # noqa: E402
from omni.layers.tokenizer_offline import token_ids  # noqa: E402
from omni.models.qwen2_5_omni.checkpoint.make_tiny import make_tiny  # noqa: E402
from omni.models.qwen2_5_omni.modules.audio_encoder import AudioEncoder, token_count  # noqa: E402
from omni.models.qwen2_5_omni.modules.thinker import Qwen2_5OmniThinker  # noqa: E402
from omni.models.qwen2_5_omni.modules.vision_encoder import VisionEncoder  # noqa: E402
from omni.stages.ar.config import EngineConfig  # noqa: E402
from omni.stages.ar.engine import AREngine  # noqa: E402
from omni.stages.ar.sequence import SamplingParams  # noqa: E402

IDS = token_ids()
MAX_NEW = 16
PATCH = 3 * 2 * 14 * 14


def _chat(*parts: list[int]) -> list[int]:
    user = [t for part in parts for t in part]
    return [IDS["<|im_start|>"], IDS["user"], 10, *user, IDS["<|im_end|>"], 10, IDS["<|im_start|>"], IDS["assistant"], 10]


def _audio(n: int) -> list[int]:
    return [IDS["<|audio_start|>"], *[IDS["<|audio_pad|>"]] * n, IDS["<|audio_end|>"]]


def _image(n: int) -> list[int]:
    return [IDS["<|vision_start|>"], *[IDS["<|image_pad|>"]] * n, IDS["<|vision_end|>"]]


@pytest.fixture(scope="module", params=["tiny-a", "tiny-b"])
def system(request, tmp_path_factory):
    torch.set_num_threads(1)
    ckpt = make_tiny(tmp_path_factory.mktemp(request.param), seed=3, preset=request.param)
    hf = transformers.Qwen2_5OmniForConditionalGeneration.from_pretrained(str(ckpt)).eval()
    return hf, Qwen2_5OmniThinker.from_checkpoint(ckpt), AudioEncoder.from_checkpoint(ckpt), VisionEncoder.from_checkpoint(ckpt)


def _cases(audio_enc, vision_enc):
    """(prompt, transformers' inputs, omni's thinker inputs) per kind: text, audio, image, audio + image."""
    g = torch.Generator().manual_seed(5)
    frames = 230  # three chunks for both presets' n_window
    features = torch.randn(1, 128, frames, generator=g)
    audio_kw = dict(input_features=features, feature_attention_mask=torch.ones(1, frames, dtype=torch.long))
    grid = (1, 6, 10)
    pixels = torch.randn(grid[0] * grid[1] * grid[2], PATCH, generator=g)
    image_kw = dict(pixel_values=pixels, image_grid_thw=torch.tensor([grid]))
    audio_in = {"audio_embeds": audio_enc([features[0]])[0]}
    image_in = {"image_embeds": vision_enc([pixels], [grid])[0], "image_grid_thw": [grid]}
    n_audio, n_image = token_count(frames), 15
    return {
        "text": (_chat(list(b"hello there, how are you today?")), {}, {}),
        "audio": (_chat(list(b"hear "), _audio(n_audio), list(b"?")), audio_kw, audio_in),
        "image": (_chat(list(b"look "), _image(n_image), list(b" what")), image_kw, image_in),
        "both": (_chat(_image(n_image), list(b" and "), _audio(n_audio)), {**audio_kw, **image_kw},
                 {**audio_in, **image_in}),
    }


def _reference(hf, prompt, kwargs) -> list[int]:
    with torch.no_grad():
        out = hf.thinker.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                  max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=IDS["<|im_end|>"], **kwargs)
    return out[0, len(prompt):].tolist()


def _engine(thinker, budget: int = 64, **cfg) -> AREngine:
    return AREngine(thinker, EngineConfig(block_size=4, num_blocks=256, max_model_len=256,
                                          max_num_batched_tokens=budget, eos_token_ids=(IDS["<|im_end|>"],), **cfg))


def _run(thinker, requests, budget: int = 64, stats: dict | None = None, **cfg) -> list[list[int]]:
    eng = _engine(thinker, budget, **cfg)
    seqs = [eng.add_request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=MAX_NEW), inputs=inp)
            for i, (p, inp) in enumerate(requests)]
    while eng.has_unfinished():
        eng.step()
    assert eng.stats()["free_blocks"] == 256
    if stats is not None:
        stats.update(eng.stats())
    return [s.output_token_ids for s in seqs]


def test_greedy_tokens_equal_transformers(system):
    hf, thinker, audio_enc, vision_enc = system
    cases = _cases(audio_enc, vision_enc)
    refs = {kind: _reference(hf, p, kw) for kind, (p, kw, _) in cases.items()}
    assert all(len(set(r)) > 2 for r in refs.values())  # varied tokens, not a degenerate model
    alone = {kind: _run(thinker, [(p, inp)])[0] for kind, (p, _, inp) in cases.items()}
    assert alone == refs
    # batched together, chunked prefill (16-token budget), twice each: the same tokens
    batched = _run(thinker, [(p, inp) for p, _, inp in cases.values()] * 2, budget=16)
    assert batched == list(refs.values()) * 2
    # the decode-graph path (its padded form runs eagerly on CPU) with lookahead steps: the same tokens
    stats: dict = {}
    graphed = _run(thinker, [(p, inp) for p, _, inp in cases.values()], stats=stats, cuda_graphs=True)
    assert graphed == list(refs.values()) and stats["decode_graph_steps"] and stats["num_lookahead_steps"] > 3


def test_encoders_match_transformers(system):
    hf, _, audio_enc, vision_enc = system
    g = torch.Generator().manual_seed(9)
    feats = [torch.randn(128, n, generator=g) for n in (77, 230)]
    with torch.no_grad():
        for f, got in zip(feats, audio_enc(feats)):  # batched: each as it is alone
            ref = hf.thinker.get_audio_features(f[None], torch.ones(1, f.shape[1], dtype=torch.long)).last_hidden_state
            assert got.shape == ref.shape and torch.allclose(got, ref, atol=1e-5)
        grids = [(1, 4, 4), (1, 8, 6)]
        pixels = [torch.randn(t * h * w, PATCH, generator=g) for t, h, w in grids]
        for px, grid, got in zip(pixels, grids, vision_enc(pixels, grids)):
            ref = hf.thinker.get_image_features(px, torch.tensor([grid])).pooler_output
            ref = torch.cat(list(ref)) if isinstance(ref, (list, tuple)) else ref
            assert got.shape == ref.shape and torch.allclose(got, ref, atol=1e-4)


def test_bad_inputs_are_refused(system):
    _, thinker, _, _ = system
    eng = _engine(thinker)
    with pytest.raises(InvalidRequest, match="audio placeholder"):
        eng.add_request("a", _chat(_audio(3)), SamplingParams(max_tokens=2), inputs={})
    with pytest.raises(InvalidRequest, match="unknown inputs"):
        eng.add_request("b", _chat([65]), SamplingParams(max_tokens=2), inputs={"image_deepstack": [[0.0]]})
