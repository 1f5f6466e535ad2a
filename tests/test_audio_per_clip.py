"""Each audio clip is encoded as if it came alone, so a conversation's earlier clips keep their rows.

transformers' processor pads a request's audios together. For a request with one audio omni is
exact against it. With several, the documented difference is this, and only this: a clip that is not
the longest gets, from transformers, one log-mel frame more when its samples are not a multiple of
the hop (160), and its last frame is computed over zeros where omni's (as for the clip alone) is
computed over the reflected edge; every other frame is equal to float32 rounding (bitwise on most
machines; numpy's batched FFT may round the last bit differently on others, as on some AMD EPYC
hosts). A clip under 1 s is also
padded to its own length in the encoder's convs, where transformers pads it to the request's
longest chunk. On the tiny random model that moves such a clip's rows by up to ~25 % of their scale
and can make it one audio token shorter; the longest clip's rows are unchanged (within 1e-5).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
from omni.models.qwen3_omni.modules.audio_encoder import AudioEncoder, AudioFeaturesEncoder
from omni.models.qwen3_omni.stages.preprocess import Preprocessor, audio_token_count
from omni.models.qwen3_omni.stages.preprocess_stage import PreprocessStage
from omni.kernel.stage import StageContext

KW = dict(sampling_rate=16000, padding=True, truncation=False, return_attention_mask=True, return_tensors="np")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    torch.set_num_threads(1)
    path = make_tiny(tmp_path_factory.mktemp("per-clip"), seed=2)
    thinker = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(path)).thinker.eval()
    return path, thinker, Preprocessor(path), AudioEncoder.from_checkpoint(path)


def clips(*lengths: int) -> list[np.ndarray]:
    rng = np.random.default_rng(sum(lengths))
    return [(rng.standard_normal(n) * 0.1).astype(np.float32) for n in lengths]


def reference(thinker, fx, audios):
    """transformers' features and encoder rows for one request holding `audios`, per clip."""
    ref = fx(audios, **KW)
    lengths = ref["attention_mask"].sum(-1).tolist()
    with torch.no_grad():
        rows = thinker.get_audio_features(torch.from_numpy(ref["input_features"]),
                                          feature_attention_mask=torch.from_numpy(ref["attention_mask"]))
    rows = rows.last_hidden_state.split([audio_token_count(n) for n in lengths])
    return [ref["input_features"][i, :, :n] for i, n in enumerate(lengths)], list(rows)


def encode(path, pre, audios):
    """omni's inputs and rows per clip for a request holding `audios`: the preprocess stage's chunks
    (one per attention window) through the encoder, each clip's windows in one forward."""
    from omni.models.qwen3_omni.modules.audio_encoder import default_pad_len, window_spans

    stage = PreprocessStage(StageContext(name="pre", args={"model_dir": str(path)}))
    stage.pre = pre
    emits = stage.process("r", [{"role": "user", "content": [{"type": "audio", "audio": a} for a in audios]}])
    windows = [e.data for e in emits if e.port == "audio"]
    encoder = AudioFeaturesEncoder(AudioEncoder.from_checkpoint(path))
    items, rows = [], []
    for f in pre.audio_features(audios):
        k = len(window_spans(f.shape[1], default_pad_len([f.shape[1]], pre.n_window), pre.n_window, pre.n_window_infer))
        mine, windows = windows[:k], windows[k:]
        assert len({w["pad_len"] for w in mine}) == 1
        items.append({"features": np.concatenate([w["features"] for w in mine], axis=1), "pad_len": mine[0]["pad_len"]})
        rows.append(torch.cat([o["audio_embeds"] for o in encoder.encode(mine)]))
    assert not windows
    return items, rows


def same_frames(ours, ref):
    """Equal log-mel frames, up to the last float32 bit that a batched FFT may round otherwise."""
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-6)


def close(ours, ref, tol=1e-5):
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() <= tol * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("n", [4100, 17234, 16000 * 3 + 77])
def test_a_request_with_one_audio_is_exact_against_transformers(model, n):
    path, thinker, pre, _ = model
    (audio,) = clips(n)
    ref_features, ref_rows = reference(thinker, pre.feature_extractor, [audio])
    items, rows = encode(path, pre, [audio])
    np.testing.assert_array_equal(items[0]["features"], ref_features[0])
    close(rows[0], ref_rows[0])


def test_a_clip_gives_the_same_encoder_inputs_whatever_else_the_request_holds(model):
    path, _, pre, _ = model
    a, b, c = clips(11234, 27777, 16000 * 4 + 3)
    alone, _ = encode(path, pre, [a])
    with_others, _ = encode(path, pre, [a, b, c])
    assert alone[0]["pad_len"] == with_others[0]["pad_len"]
    np.testing.assert_array_equal(alone[0]["features"], with_others[0]["features"])


@pytest.mark.parametrize("lengths", [(32777, 4100), (32777, 17234), (16000 * 5 + 3, 32099, 1234), (32000, 19200)])
def test_several_audios_differ_from_transformers_only_as_documented(model, lengths):
    path, thinker, pre, _ = model
    audios = clips(*lengths)
    ref_features, ref_rows = reference(thinker, pre.feature_extractor, audios)
    items, rows = encode(path, pre, audios)
    longest = int(np.argmax(lengths))
    for i, (item, ref) in enumerate(zip(items, ref_features)):
        ours = item["features"]
        if i == longest:
            same_frames(ours, ref)
            close(rows[i], ref_rows[i])
            continue
        hop = pre.feature_extractor.hop_length
        assert ref.shape[1] - ours.shape[1] == (1 if lengths[i] % hop else 0)
        same_frames(ours[:, :-1], ref[:, :ours.shape[1] - 1])  # all but the last frame
        assert 0 <= len(ref_rows[i]) - len(rows[i]) <= 1
        k = len(rows[i])
        assert (rows[i][:k] - ref_rows[i][:k]).abs().max().item() <= 0.3 * ref_rows[i].abs().max().item()


class Rows:
    """A stand-in encoder: 1 MiB of output per item."""

    def batch_key(self, item):
        return 0

    def encode(self, items):
        return [{"rows": np.full(1 << 18, float(it["x"][0]), np.float32)} for it in items]


def test_the_encoder_cache_is_bounded_by_bytes_and_entries():
    from omni.stages.encoder import EncoderStage

    stage = EncoderStage(StageContext(name="enc", args={"cache_size": 100, "cache_mb": 3}), encoder=Rows())
    for i in range(5):
        stage.open(f"r{i}", {})
        stage.feed(f"r{i}", "in", {"x": np.array([i])})
        stage.close_input(f"r{i}")
        stage.step()
    stats = stage.stats()
    assert stats["cache_entries"] == 3 and stats["cache_bytes"] == 3 << 20
    stage.open("again", {})
    stage.feed("again", "in", {"x": np.array([4])})  # the newest stays, the oldest went
    stage.feed("again", "in", {"x": np.array([0])})
    assert stage.cache_hits == 1
    with pytest.raises(Exception, match="cache_mb"):
        EncoderStage(StageContext(name="enc", args={"cache_mb": -1}), encoder=Rows())


def test_clip_features_are_extracted_once_per_clip(model):
    _, _, pre, _ = model
    a, b = clips(8000, 9000)
    before = pre.clip_features.computed
    first = pre.audio_features([a, b])
    again = pre.audio_features([a, b, a])
    assert pre.clip_features.computed - before == 2
    np.testing.assert_array_equal(first[0], again[2])
