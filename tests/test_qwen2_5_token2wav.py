"""Qwen2.5-Omni's token2wav under the diffusion stage vs transformers (the oracle), two tiny shapes:
the whole utterance's mel and waveform with the reference's own noise, batched steps == alone,
8 concurrent == alone, and the streamed audio within its documented tolerance of the whole."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from omni.kernel.errors import InvalidRequest
from omni.kernel.stage import StageContext
from omni.models.qwen2_5_omni.checkpoint.make_tiny import PRESETS, make_tiny
from omni.models.qwen2_5_omni.modules.token2wav import Token2Wav
from omni.stages.diffusion import DiffusionStage

TOL = 1e-4  # of the peak
STREAM_TOL = 5e-3  # streamed (DiffusionArgs defaults: windows of 2-3 blocks, 2 back, 1 ahead) vs whole,
# of the peak; measured 1.0e-3 (tiny-a) and 3.3e-4 (tiny-b): the ODE carries context a window lacks
BF16_TOL = 2e-2  # the DiT in bfloat16 vs float32, of the mel's peak; measured 4.1e-3 (tiny-a), 2.7e-3 (tiny-b)


@pytest.fixture(scope="module", params=sorted(PRESETS))  # the whole model's tiny presets: token2wav's differ too
def pair(request, tmp_path_factory):
    from safetensors.torch import load_file
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniToken2WavConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

    torch.set_num_threads(1)
    path = make_tiny(tmp_path_factory.mktemp(request.param), seed=1, preset=request.param)
    cfg = Qwen2_5OmniToken2WavConfig(**json.loads((path / "config.json").read_text())["token2wav_config"])
    ref = Qwen2_5OmniToken2WavModel(cfg).eval()
    state = {k[len("token2wav."):]: v for k, v in load_file(path / "model.safetensors").items()
             if k.startswith("token2wav.")}  # the checkpoint holds the whole model
    ref.load_state_dict(state, strict=True)
    return Token2Wav.from_checkpoint(path), ref, torch.load(path / "spk_dict.pt", weights_only=True)


def _codes(model, n, seed):
    return torch.randint(0, model.codebook_size - 1, (1, n), generator=torch.Generator().manual_seed(seed))


def _reference(ref, spk, codes, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        mel = ref.code2wav_dit_model.sample(spk["cond"], spk["ref_mel"], codes)
        return mel, ref.code2wav_bigvgan_model(mel).reshape(-1)


def _run(stage, feeds: dict, params: dict, piece: int = 1000, out_key: str = "pcm"):
    """Feed every request `piece` tokens a round, stepping between rounds; collect each one's output."""
    out = {rid: [] for rid in feeds}
    for rid in feeds:
        stage.open(rid, params[rid])
    rounds = max(-(-len(c) // piece) for c in feeds.values())
    for i in range(rounds + 1):
        for rid, c in feeds.items():
            if i * piece < len(c):
                stage.feed(rid, "codes", {"codes": c[i * piece:(i + 1) * piece]})
            elif (i - 1) * piece < len(c) or i == 0:
                stage.close_input(rid)
        while stage.has_work():
            for e in stage.step():
                if e.data is not None:
                    out[e.rid].append(e.data[out_key])
    assert not stage.requests
    return {rid: np.concatenate(v) for rid, v in out.items()}


def _close(a, b, tol):
    peak = float(np.abs(b).max())
    assert peak > 1e-2, "degenerate"
    err = float(np.abs(a - b).max())
    assert err <= tol * peak, (err, peak)
    return err / peak


def _stage(model, **args):
    return DiffusionStage(StageContext(name="token2wav", args=args), model=model)


def test_whole_utterance_mel_and_waveform_equal_the_reference(pair):
    model, ref, speakers = pair
    codes = _codes(model, 29, seed=3)
    for name in speakers:
        mel, wav = _reference(ref, speakers[name], codes, seed=11)
        assert float((wav.abs() >= 1).float().mean()) < 0.25  # most samples not clipped
        pcm = _run(_stage(model, first_chunk_blocks=0), {"a": codes[0].numpy()}, {"a": {"seed": 11, "speaker": name}})
        _close(pcm["a"], wav.numpy(), TOL)
        render, model.render = model.render, None  # the latent itself: the mel
        try:
            lat = _run(_stage(model, first_chunk_blocks=0), {"a": codes[0].numpy()},
                       {"a": {"seed": 11, "speaker": name}}, out_key="latent")
        finally:
            del model.render
        _close(lat["a"].T, mel[0].numpy(), TOL)


def test_the_dit_in_bfloat16_stays_near_float32(pair):
    """The graph runs the DiT in the server's dtype on CUDA (`dit_dtype`; the ODE's state and BigVGAN
    stay float32): its mel within BF16_TOL of the float32 mel's peak (measured 2026-12-04 on both tiny
    shapes, one seed: see the assertion's report)."""
    import copy

    model = pair[0]
    half = copy.deepcopy(model)
    half.code2wav_dit_model.to(torch.bfloat16)
    codes = _codes(model, 29, seed=3)[0].numpy()
    mels = []
    for m in (model, half):
        m.render = None
        try:
            mels.append(_run(_stage(m, first_chunk_blocks=0), {"a": codes}, {"a": {"seed": 11}}, out_key="latent")["a"])
        finally:
            del m.render
    _close(mels[1], mels[0], BF16_TOL)


def test_batched_steps_equal_each_request_alone(pair):
    """Requests joining at different times sit at different ODE steps and sub-steps in one forward."""
    model, _, _ = pair
    lengths = {"a": 17, "b": 26, "c": 9, "d": 26}
    feeds = {rid: _codes(model, n, seed=n)[0].numpy() for rid, n in lengths.items()}
    params = {rid: {"seed": i, "sampling": {"token2wav": {"guidance_scale": 0.0 if rid == "d" else 0.5}}}
              for i, rid in enumerate(feeds)}
    stage = _stage(model, first_chunk_blocks=0)
    out = {rid: [] for rid in feeds}
    order = list(feeds)  # staggered: each opens 5 steps after the one before
    for k in range(200):
        if k % 5 == 0 and order:
            rid = order.pop(0)
            stage.open(rid, params[rid])
            stage.feed(rid, "codes", {"codes": feeds[rid]})
            stage.close_input(rid)
        if not stage.has_work() and not order:
            break
        for e in stage.step():
            if e.data is not None:
                out[e.rid].append(e.data["pcm"])
    assert stage.rows > stage.forwards  # rows of several requests shared forwards
    assert stage.forwards <= k + 1  # windows of different lengths share one padded forward a step
    for rid in feeds:
        alone = _run(_stage(model, first_chunk_blocks=0), {rid: feeds[rid]}, {rid: params[rid]})[rid]
        np.testing.assert_allclose(np.concatenate(out[rid]), alone, atol=1e-5 * max(1e-3, np.abs(alone).max()))


def test_tokens_waiting_for_their_windows_context_are_no_backlog(pair):
    """The actor stops feeding a stage past `max_queue` of backlog; tokens that wait for their
    window's right context must not count, or streams starve each other (16 streams x 36 tokens > 256),
    and runnable windows count as one each, or 256 tokens of them capped a forward at ~8 windows."""
    model = pair[0]
    stage = _stage(model)
    for i in range(16):
        stage.open(f"r{i}", {"seed": i})
        c = stage.chunking
        stage.feed(f"r{i}", "codes", {"codes": _codes(model, c.first_chunk + c.right - 1, seed=i)[0].numpy()})
    assert stage.backlog() == 0 and not stage.has_work()  # every window waits for one more token
    stage.feed("r3", "codes", {"codes": _codes(model, 1, seed=99)[0].numpy()})
    assert stage.backlog() == 1 and stage.has_work()
    stage.step()  # r3's window runs: still one window of work, until it finishes
    assert stage.backlog() == 1 and stage.requests["r3"].running is not None


def test_eight_concurrent_streams_equal_alone(pair):
    model, _, _ = pair
    feeds = {f"r{i}": _codes(model, 20 + 3 * i, seed=i)[0].numpy() for i in range(8)}
    params = {rid: {"seed": 100 + i} for i, rid in enumerate(feeds)}
    together = _run(_stage(model, max_batch=8), feeds, params, piece=4)
    for rid in feeds:
        alone = _run(_stage(model), {rid: feeds[rid]}, {rid: params[rid]}, piece=4)[rid]
        np.testing.assert_allclose(together[rid], alone, atol=1e-5 * np.abs(alone).max())


def test_streamed_with_full_context_equals_whole_and_default_within_tolerance(pair):
    model, ref, speakers = pair
    codes = _codes(model, 40, seed=9)
    _, wav = _reference(ref, next(iter(speakers.values())), codes, seed=5)
    feeds, params = {"a": codes[0].numpy()}, {"a": {"seed": 5}}
    wide = _run(_stage(model, first_chunk_blocks=1, chunk_blocks=1, left_context_blocks=99, right_context_blocks=99),
                feeds, params, piece=3)["a"]
    _close(wide, wav.numpy(), TOL)  # the windows' machinery (noise slices, trims, vocoder context) is exact
    streamed = _run(_stage(model), feeds, params, piece=3)["a"]
    assert streamed.shape == wav.shape
    print("streamed vs whole, of peak:", _close(streamed, wav.numpy(), STREAM_TOL))


def test_the_stage_kind_builds_from_a_checkpoint(tmp_path):
    from omni.models.registry import REGISTRY

    path = make_tiny(tmp_path / "t", seed=2, preset="tiny-b")
    cls = REGISTRY.stage_class("qwen2.5-omni.token2wav")
    args_cls = REGISTRY.stage_args_class("qwen2.5-omni.token2wav")
    assert args_cls.__name__ == "Token2WavArgs"
    with pytest.raises(ValueError):
        args_cls(solver="dopri5")
    stage = cls(StageContext(name="token2wav", args={"model_dir": str(path), "solver": "euler", "num_steps": 3}))
    stage.setup()
    pcm = _run(stage, {"a": np.arange(9)}, {"a": {"seed": 1, "speaker": "Ethan"}})["a"]
    assert pcm.shape == (9 * 4 * stage.model.code2wav_bigvgan_model.hop,) and np.isfinite(pcm).all()


def test_a_seed_in_the_typed_sampling_the_bus_carries_is_the_seed(pair):
    """On the bus a request's per-stage sampling is a typed `Sampling` (omni/sampling.py), not a dict:
    its seed draws the same noise as the dict form a stage driven in-process gets."""
    from omni.sampling import Sampling

    model = pair[0]
    codes = np.arange(12) % (model.codebook_size - 1)
    typed = _run(_stage(model, num_steps=3), {"a": codes}, {"a": {"sampling": {"token2wav": Sampling(seed=7)}}})["a"]
    plain = _run(_stage(model, num_steps=3), {"a": codes}, {"a": {"sampling": {"token2wav": {"seed": 7}}}})["a"]
    other = _run(_stage(model, num_steps=3), {"a": codes}, {"a": {"sampling": {"token2wav": Sampling(seed=8)}}})["a"]
    np.testing.assert_array_equal(typed, plain)
    assert not np.array_equal(typed, other)


def test_padded_rows_equal_each_row_alone(pair):
    """`velocity` with lengths: a row's real frames as the row alone gives them, whatever the padding
    (the last real block looks ahead into padded frames, which it must not see); a padding row stays
    finite. This is what lets windows of every length share one forward (and one CUDA graph)."""
    from omni.stages.diffusion_graphs import PaddedVelocity

    model = pair[0]
    block, fpt = model.pad_frames, model.frames_per_token
    lengths = [fpt * 3, block + fpt, 2 * block, fpt]
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(n, model.latent_dim, generator=g) for n in lengths]
    feats = [torch.randn(n, model.feature_dim, generator=g) for n in lengths]
    ts = [torch.tensor(v) for v in (0.1, 0.5, 0.9, 0.3)]
    padded = PaddedVelocity(model, max_rows=8, max_frames=3 * block, cuda_graphs=False)
    v = padded(xs, ts, feats)
    assert v.shape[1] == 2 * block and torch.isfinite(v).all()
    for i, n in enumerate(lengths):
        with torch.inference_mode():
            alone = model.velocity(xs[i][None], ts[i][None], feats[i][None])[0]
        torch.testing.assert_close(v[i, :n], alone, rtol=0, atol=1e-5 * float(alone.abs().max()))


@pytest.mark.gpu
def test_velocity_graphs_equal_the_eager_padded_forward_on_cuda(tmp_path):
    from omni.stages.diffusion_graphs import PaddedVelocity

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = Token2Wav.from_checkpoint(make_tiny(tmp_path / "t", seed=1, preset="tiny-a"), device="cuda")
    block, fpt = model.pad_frames, model.frames_per_token
    graphs = PaddedVelocity(model, max_rows=8, max_frames=3 * block, cuda_graphs=True)
    eager = PaddedVelocity(model, max_rows=8, max_frames=3 * block, cuda_graphs=False)
    assert graphs.capture_all() == len(graphs.row_sizes) * len(graphs.frame_sizes)
    g = torch.Generator(device="cuda").manual_seed(0)
    for lengths in ([fpt * 3], [block + fpt, 2 * block, fpt], [3 * block] * 5, [block] * 8):
        xs = [torch.randn(n, model.latent_dim, device="cuda", generator=g) for n in lengths]
        feats = [torch.randn(n, model.feature_dim, device="cuda", generator=g) for n in lengths]
        ts = [torch.rand((), device="cuda", generator=g) for _ in lengths]
        got, want = graphs(xs, ts, feats), eager(xs, ts, feats)
        for i, n in enumerate(lengths):
            torch.testing.assert_close(got[i, :n], want[i, :n], rtol=0, atol=1e-5 * float(want[i, :n].abs().max()))
    assert graphs.replays == 4 and eager.replays == 0


def test_torch_codes_stay_on_their_device_and_a_bad_one_fails_only_its_request(pair):
    """Codes fed as tensors (the talker's, through cuda_ipc on a GPU) are not copied to the host per
    message (on the H200 that copy waited behind the DiT forward in flight: 33 % of token2wav's time at
    c=1); their range is checked on the device and read once a window ends. The same PCM as numpy codes;
    a code out of range fails that request with a clear error, never a device assert or its neighbours."""
    model = pair[0]
    codes = _codes(model, 30, seed=5)[0]
    as_numpy = _run(_stage(model), {"a": codes.numpy()}, {"a": {"seed": 2}}, piece=7)["a"]
    as_torch = _run(_stage(model), {"a": codes.clone()}, {"a": {"seed": 2}}, piece=7)["a"]
    np.testing.assert_array_equal(as_torch, as_numpy)
    stage = _stage(model)
    bad = codes.clone()
    bad[20] = model.codebook_size  # one past the codebook
    for rid, c in (("good", codes), ("bad", bad)):
        stage.open(rid, {"seed": 2})
        stage.feed(rid, "codes", {"codes": c})
        stage.close_input(rid)
    errors, finished = {}, set()
    while stage.has_work():
        for e in stage.step():
            if e.error is not None:
                errors[e.rid] = (e.error, e.error_kind)
            if e.finish:
                finished.add(e.rid)
    assert errors == {"bad": (f"codes must lie in [0, {model.codebook_size})", "invalid_request")}
    assert finished == {"good"} and not stage.requests
    with pytest.raises(InvalidRequest):
        stage.open("f", {"seed": 1})
        stage.feed("f", "codes", {"codes": codes.float()})
