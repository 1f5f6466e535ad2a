"""Qwen3-TTS's talker against the reference (`qwen_tts`'s `Qwen3TTSModel.generate_*`), greedy codes exact.

Every case runs the reference's own wrapper (`generate_custom_voice`, `generate_voice_design`,
`generate_voice_clone` at greedy: its tokenization, defaults, language / speaker rules, the
in-context prompt) on a tiny random checkpoint written by omni's `make_tiny`; its speech tokenizer
is replaced by one that returns the codes it is asked to decode, so what is compared is exactly
the codes the reference hands to its decoder. omni runs its preprocess stage and its talker stage
(the AR engine, the sampler, the code predictor) and must emit the very same frames. Two tiny
sizes: tiny-a (predictor as wide as the talker, 4 code groups) and tiny-b (a narrower predictor
behind `small_to_mtp_projection`, 8 groups).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import qwen3_tts_reference
from kernel_helpers import unbatched
from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import StageContext
from omni.models.qwen3_tts.checkpoint.make_tiny import write_model
from omni.models.qwen3_tts.config import load_config, parse_config
from omni.models.qwen3_tts.modules.talker import TTSTalkerModel
from omni.models.qwen3_tts.stages.preprocess_stage import PreprocessStage
from omni.models.qwen3_tts.stages.talker_stage import TTSTalkerStage
from omni.models.weights import CheckpointError

REF = qwen3_tts_reference.load()
pytestmark = pytest.mark.skipif(REF is None, reason="the Qwen3-TTS reference (qwen-tts-hf, librosa, einops) is not installed")
MAX_TOKENS = 24
PRESETS = ("tiny-a", "tiny-b")


class CodesOnly:
    """The reference's speech tokenizer, as far as its generate_* use it: decode returns the codes."""

    def decode(self, items):
        return [np.asarray(item["audio_codes"].cpu()) for item in items], 24000


class Oracle:
    def __init__(self, model_dir: Path) -> None:
        from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration, Qwen3TTSProcessor
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        self.dir = model_dir
        raw = json.loads((model_dir / "config.json").read_text())
        model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**raw)).eval()
        self.missing, self.unexpected = model.load_state_dict(load_file(model_dir / "model.safetensors"), strict=False)
        model.load_speech_tokenizer(CodesOnly())
        processor = Qwen3TTSProcessor(tokenizer=AutoTokenizer.from_pretrained(str(model_dir)))
        defaults = json.loads((model_dir / "generation_config.json").read_text())
        self.wrapper = REF.Qwen3TTSModel(model, processor, defaults)
        self.kind = raw["tts_model_type"]

    def codes(self, case: dict) -> np.ndarray:
        greedy = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=MAX_TOKENS)
        w, lang = self.wrapper, case.get("language")
        if self.kind == "custom_voice":
            wavs, _ = w.generate_custom_voice(case["input"], speaker=case["voice"], language=lang,
                                              instruct=case.get("instructions"), **greedy, **_mode(case))
        elif self.kind == "voice_design":
            wavs, _ = w.generate_voice_design(case["input"], instruct=case.get("instructions", ""), language=lang,
                                              **greedy, **_mode(case))
        else:
            item = REF.VoiceClonePromptItem(ref_code=case.get("ref_codes"), ref_spk_embedding=case["spk_embedding"],
                                            x_vector_only_mode=case.get("ref_codes") is None,
                                            icl_mode=case.get("ref_codes") is not None, ref_text=case.get("ref_text"))
            wavs, _ = w.generate_voice_clone(case["input"], language=lang, voice_clone_prompt=[item], **greedy,
                                             **_mode(case))
        return wavs[0]


def _mode(case: dict) -> dict:
    return {} if "non_streaming_text" not in case else {"non_streaming_mode": case["non_streaming_text"]}


def params_of(case: dict, max_tokens: int = MAX_TOKENS) -> dict:
    keys = ("input", "voice", "instructions", "language", "non_streaming_text")
    return {**{k: case[k] for k in keys if k in case},
            "sampling": {"talker": {"temperature": 0, "max_tokens": max_tokens}}}


def voice_of(case: dict) -> dict:
    codes = case.get("ref_codes")
    return {"spk_embedding": case["spk_embedding"].numpy(),
            "ref_codes": None if codes is None else codes.numpy(), "ref_text": case.get("ref_text")}


class Omni:
    """omni's preprocess and talker stages in-process, stepped by hand."""

    def __init__(self, model_dir: Path, model: TTSTalkerModel) -> None:
        self.base = load_config(model_dir).kind == "base"
        self.pre = PreprocessStage(StageContext("preprocess", args={"model_dir": str(model_dir)},
                                                out_ports=["prompt"] + (["voice"] if self.base else [])))
        self.pre.setup()
        self.talker = TTSTalkerStage(StageContext(
            "talker", args={"model": model, "model_dir": str(model_dir), "num_blocks": 256, "block_size": 8,
                            "max_model_len": 512, "predictor_temperature": 0.9},
            in_ports=["prompt"] + (["voice"] if self.base else []), out_ports=["codes"]))
        self.talker.setup()

    def start(self, rid: str, case: dict, **params) -> None:
        p = {**params_of(case), **params}
        self.pre.open(rid, p)
        self.pre.close_input(rid)
        self.talker.open(rid, p)
        for e in self.pre.step():
            assert e.error is None, e.error
            if e.port == "prompt":
                self.talker.feed(rid, "prompt", e.data)
        if self.base:
            self.talker.feed(rid, "voice", voice_of(case))
        self.talker.close_input(rid)

    def run(self, cases: dict[str, dict], **params) -> dict[str, np.ndarray]:
        for rid, case in cases.items():
            self.start(rid, case, **params)
        frames: dict[str, list] = {rid: [] for rid in cases}
        done: set[str] = set()
        for _ in range(10_000):
            if len(done) == len(cases):
                break
            for e in unbatched(self.talker.step()):
                assert e.error is None, e.error
                if e.data is not None and "codes" in e.data:
                    frames[e.rid].append(e.data["codes"])
                if e.finish:
                    done.add(e.rid)
        assert done == set(cases)
        groups = self.talker.model.num_code_groups
        return {rid: np.concatenate(f) if f else np.zeros((0, groups), np.int64) for rid, f in frames.items()}


def cases_for(kind: str, cfg) -> list[dict]:
    if kind == "custom_voice":
        return [
            {"input": "hello there, how are you today?", "voice": "vivian"},
            {"input": "speak this line, please", "voice": "Serena", "instructions": "whisper it, slowly",
             "language": "english"},
            {"input": "a dialect speaker", "voice": "eric", "language": "auto"},  # auto -> eric's dialect tag
            {"input": "streamed text input", "voice": "vivian", "language": "chinese", "non_streaming_text": False},
        ]
    if kind == "voice_design":
        return [
            {"input": "good morning to everyone", "voice": "any", "instructions": "a deep calm male voice"},
            {"input": "no description at all", "voice": "any", "language": "english"},
            {"input": "text that streams in", "voice": "any", "instructions": "bright", "non_streaming_text": False},
        ]
    gen = torch.Generator().manual_seed(7)
    h, g, c = cfg.talker.hidden_size, cfg.num_code_groups, cfg.code_predictor.vocab_size

    def emb():
        return torch.randn(h, generator=gen)

    def codes(n):
        return torch.randint(0, c, (n, g), generator=gen)

    return [
        {"input": "hi", "spk_embedding": emb(), "ref_codes": codes(5), "ref_text": "a longer reference transcript"},
        {"input": "a longer text to speak than the clip", "spk_embedding": emb(), "ref_codes": codes(12),
         "ref_text": "short", "language": "english"},
        {"input": "only the speaker embedding", "spk_embedding": emb()},  # x-vector only
        {"input": "whole text first", "spk_embedding": emb(), "ref_codes": codes(6), "ref_text": "the clip",
         "non_streaming_text": True},
    ]


def _checkpoint(tmp_path_factory, preset: str, kind: str) -> Path:
    if kind == "base":
        pytest.importorskip("omni.models.qwen3_tts.modules.speaker_encoder")
    return write_model(tmp_path_factory.mktemp(f"{kind}-{preset}"), kind, preset, seed=0)


@pytest.fixture(scope="module", params=[(p, k) for p in PRESETS for k in ("custom_voice", "voice_design", "base")],
                ids=lambda pk: f"{pk[0]}-{pk[1]}")
def setup(request, tmp_path_factory):
    preset, kind = request.param
    path = _checkpoint(tmp_path_factory, preset, kind)
    model = TTSTalkerModel.from_checkpoint(path)
    return kind, Oracle(path), Omni(path, model), cases_for(kind, model.cfg)


def test_reference_loads_every_weight_of_the_checkpoint(setup):
    _, oracle, _, _ = setup
    assert oracle.missing == [] and oracle.unexpected == []


def test_greedy_codes_equal_the_reference(setup):
    kind, oracle, omni, cases = setup
    lengths = set()
    for i, case in enumerate(cases):
        want = oracle.codes(case)
        got = omni.run({f"r{i}": case})[f"r{i}"]
        assert got.shape == want.shape and np.array_equal(got, want), (case, want[:3], got[:3])
        lengths.add(len(want))
    assert all(0 < n <= MAX_TOKENS - 1 for n in lengths)


def test_concurrent_requests_give_what_each_gives_alone(setup):
    kind, oracle, omni, cases = setup
    batch = {f"c{i}": cases[i % len(cases)] for i in range(8)}
    alone = {rid: omni.run({"alone": case})["alone"] for rid, case in batch.items()}
    together = omni.run(batch)
    for rid in batch:
        assert np.array_equal(together[rid], alone[rid]), rid


def test_seeded_sampling_repeats_and_stays_in_the_codebook(setup):
    kind, _, omni, cases = setup
    sampling = {"talker": {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "seed": 5, "max_tokens": MAX_TOKENS}}
    a = omni.run({"s": cases[0]}, sampling=sampling)["s"]
    b = omni.run({"s": cases[0]}, sampling=sampling)["s"]
    assert np.array_equal(a, b) and len(a) > 0
    assert a.min() >= 0 and a.max() < omni.talker.model.code_predictor.spec.vocab_size


def test_bad_requests_fail_when_they_open(setup):
    kind, _, omni, cases = setup
    bad = [{"input": "   "}, {"input": "x", "language": "klingon"}]
    if kind == "custom_voice":
        bad.append({"input": "x", "voice": "nobody"})
    if kind == "base":
        bad.append({"input": "x", "instructions": "sound happy"})
    for params in bad:
        with pytest.raises(InvalidRequest):
            omni.pre.open("bad", params)


def test_talker_refuses_a_clone_without_its_transcript_or_embedding(tmp_path_factory):
    path = _checkpoint(tmp_path_factory, "tiny-a", "base")
    omni = Omni(path, TTSTalkerModel.from_checkpoint(path))
    case = cases_for("base", load_config(path))[0]
    for voice in ({"spk_embedding": None}, {**voice_of(case), "ref_text": ""}):
        omni.talker.open("r", params_of(case))
        omni.talker.feed("r", "prompt", {"input_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9], "language": "auto"})
        omni.talker.feed("r", "voice", voice)
        omni.talker.close_input("r")
        errors = [e for e in omni.talker.step() if e.error]
        assert errors and errors[0].error_kind == "invalid_request"


class DeviceTensor(torch.Tensor):
    """A tensor as a cuda_ipc edge delivers it (voice stage and talker both on a GPU): no host view
    (numpy() / __array__ refuse, as a CUDA tensor's do); only an explicit copy to the CPU reads it."""

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy")

    def __array__(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy")

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor).clone()

    def to(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor).clone().to(*args, **kwargs)


def test_talker_takes_its_voice_as_device_tensors_valid_during_feed_only(tmp_path_factory):
    """The H200's first Base run failed here: the voice arrives as device tensors, and the channel
    reuses their buffer once `feed` returns. Codes must equal those of host arrays, and the
    reference codes the talker passes on to the codec must be host arrays."""
    path = _checkpoint(tmp_path_factory, "tiny-a", "base")
    omni = Omni(path, TTSTalkerModel.from_checkpoint(path))
    case = cases_for("base", load_config(path))[0]
    want = omni.run({"h": case})["h"]
    params = params_of(case)
    omni.pre.open("d", params)
    omni.pre.close_input("d")
    omni.talker.open("d", params)
    prompt = next(e.data for e in omni.pre.step() if e.port == "prompt")
    voice = {"spk_embedding": case["spk_embedding"].clone().as_subclass(DeviceTensor),
             "ref_codes": case["ref_codes"].clone().as_subclass(DeviceTensor), "ref_text": case["ref_text"]}
    omni.talker.feed("d", "voice", voice)
    for key in ("spk_embedding", "ref_codes"):  # the channel's slot is reused before the prompt arrives
        voice[key].as_subclass(torch.Tensor).zero_()
    omni.talker.feed("d", "prompt", prompt)
    omni.talker.close_input("d")
    frames, ref = [], None
    for _ in range(1000):
        emits = unbatched(omni.talker.step())
        assert all(e.error is None for e in emits), [e.error for e in emits]
        for e in emits:
            if e.data and "ref_codes" in e.data:
                ref = e.data["ref_codes"]
            elif e.data:
                frames.append(e.data["codes"])
        if any(e.finish for e in emits):
            break
    assert isinstance(ref, np.ndarray) and np.array_equal(ref, case["ref_codes"].numpy())
    assert np.array_equal(np.concatenate(frames), want)


@pytest.mark.parametrize("kind", ["custom_voice", "base"])
def test_warm_up_runs_a_prefill_of_each_warm_length(tmp_path_factory, kind):
    """A streamed text's prefill has the same few rows whatever its length, so the warm-up varies
    what enters the prefill (instruction rows; a Base voice's reference frames)."""
    path = _checkpoint(tmp_path_factory, "tiny-a", kind)
    talker = Omni(path, TTSTalkerModel.from_checkpoint(path)).talker
    lengths = talker.warm_lengths()
    prefills = []
    for i, (params, chunks) in enumerate(talker.warm_requests()):
        talker.open(f"w{i}", params)
        for port, data in chunks:
            talker.feed(f"w{i}", port, data)
        talker.close_input(f"w{i}")
        prefills.append(talker._streams[f"w{i}"].request.prefill_len)
        talker.abort(f"w{i}")
    wanted = [n for n in lengths if n >= min(prefills)]  # shorter ones cannot be built
    assert len(wanted) >= 5 and all(any(n - 4 <= p <= n for p in prefills) for n in wanted), (prefills, lengths)
    assert talker.warm_up(force=True) == len(prefills)


def _config(tmp_path: Path) -> dict:
    return json.loads((write_model(tmp_path, "custom_voice", "tiny-a", 0) / "config.json").read_text())


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.update(tts_model_type="dialogue"), "unknown tts_model_type"),
    (lambda c: c.update(tokenizer_type="qwen3_tts_tokenizer_25hz"), "tokenizer_type"),
    (lambda c: c["talker_config"].update(use_sliding_window=True), "sliding-window"),
    (lambda c: c["talker_config"]["rope_scaling"].update(rope_type="yarn"), "rope type"),
    (lambda c: c["talker_config"].update(spk_id={"vivian": 10**6}), "outside the talker vocabulary"),
    (lambda c: c["talker_config"].update(spk_id={}), "named speakers"),
    (lambda c: c.update(architectures=["Qwen3OmniMoeForConditionalGeneration"]), "not a Qwen3-TTS"),
])
def test_config_is_strict(tmp_path, edit, message):
    raw = _config(tmp_path)
    parse_config(raw)
    edit(raw)
    with pytest.raises(CheckpointError, match=message):
        parse_config(raw)


def test_make_tiny_writes_the_same_bytes_for_a_seed(tmp_path):
    a = write_model(tmp_path / "a", "voice_design", "tiny-b", seed=3)
    b = write_model(tmp_path / "b", "voice_design", "tiny-b", seed=3)
    c = write_model(tmp_path / "c", "voice_design", "tiny-b", seed=4)
    blob = lambda p: (p / "model.safetensors").read_bytes()  # noqa: E731
    assert blob(a) == blob(b) != blob(c)
    assert json.loads((a / "omni_tiny.json").read_text())["random_weights"] is True


@pytest.fixture(scope="module", params=[(p, k) for p in PRESETS for k in ("custom_voice", "voice_design", "base")],
                ids=lambda pk: f"{pk[0]}-{pk[1]}")
def full(request, tmp_path_factory):
    """A whole checkpoint (speech tokenizer included) loaded by the reference's own from_pretrained."""
    from omni.models.qwen3_tts.checkpoint.make_tiny import make_tiny

    preset, kind = request.param
    path = make_tiny(tmp_path_factory.mktemp(f"full-{kind}-{preset}"), kind, preset, seed=1)
    model = TTSTalkerModel.from_checkpoint(path)
    return kind, path, REF.Qwen3TTSModel.from_pretrained(str(path)), Omni(path, model), cases_for(kind, model.cfg)


def test_waveform_equals_the_reference(full):
    """omni's talker codes through omni's 12 Hz decoder vs the reference's whole generate_* (its decoder,
    its in-context cut of the reference frames), within 1e-4 of the waveform's peak."""
    from omni.models.qwen3_tts.modules.speech_tokenizer_decoder import SpeechTokenizerDecoder

    kind, path, ref, omni, cases = full
    decoder = SpeechTokenizerDecoder.from_dir(path / "speech_tokenizer")
    greedy = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=MAX_TOKENS)
    case = cases[0]
    if kind == "custom_voice":
        wavs, rate = ref.generate_custom_voice(case["input"], speaker=case["voice"], **greedy)
    elif kind == "voice_design":
        wavs, rate = ref.generate_voice_design(case["input"], instruct=case["instructions"], **greedy)
    else:
        item = REF.VoiceClonePromptItem(ref_code=case["ref_codes"], ref_spk_embedding=case["spk_embedding"],
                                        x_vector_only_mode=False, icl_mode=True, ref_text=case["ref_text"])
        wavs, rate = ref.generate_voice_clone(case["input"], voice_clone_prompt=[item], **greedy)
    want = np.asarray(wavs[0], dtype=np.float32)
    codes = torch.from_numpy(omni.run({"w": case})["w"])
    context = case.get("ref_codes")
    frames = codes if context is None else torch.cat((context, codes))
    with torch.no_grad():
        got = decoder(frames.T[None]).reshape(-1).numpy()
    if context is not None:  # the reference's cut: the reference frames' share of the samples
        got = got[int(len(context) / len(frames) * len(got)):]
    peak = float(np.abs(want).max())
    assert rate == 24000 and got.shape == want.shape and peak > 1e-3
    assert float(np.abs(got - want).max()) <= 1e-4 * peak


@pytest.mark.parametrize("kind", ["custom_voice", "voice_design", "base"])
def test_graph_per_kind(tmp_path, kind):
    from omni.models.qwen3_tts.graph import build

    graph, info = build(write_model(tmp_path, kind, "tiny-a", 0), first_chunk_frames=3)
    names = [s.name for s in graph.stages]
    assert names == (["preprocess", "voice", "talker", "codec"] if kind == "base" else ["preprocess", "talker", "codec"])
    assert graph.stage("codec").args["first_chunk_frames"] == 3
    talker = graph.stage("talker").args
    assert talker["default_sampling"]["temperature"] == 0.9 and talker["default_sampling"]["max_tokens"] == 64
    assert info.speaks and info.random_weights and info.instructions == (kind != "base")
    assert info.voices == (["vivian", "serena", "eric"] if kind == "custom_voice" else [])
    assert info.clones_voices == (kind == "base")
