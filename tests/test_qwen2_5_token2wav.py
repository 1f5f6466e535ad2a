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
STREAM_TOL = 5e-3  # streamed (DiffusionArgs defaults: a first chunk of 2 blocks, then growing to 8; 2 back, 1 ahead) vs whole,
# of the peak; measured 7.6e-4 (tiny-a) and 3.3e-4 (tiny-b): the ODE carries context a window lacks
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
    model = pair[0]
    block, fpt = model.pad_frames, model.frames_per_token
    lengths = [fpt * 3, block + fpt, 2 * block, fpt]
    g = torch.Generator().manual_seed(3)
    width = 2 * block
    x = torch.randn(len(lengths), width, model.latent_dim, generator=g)
    feats = torch.randn(len(lengths), width, model.feature_dim, generator=g)
    t = torch.tensor([0.1, 0.5, 0.9, 0.3])
    with torch.inference_mode():
        v = model.velocity(x, t, feats, torch.tensor(lengths))
    assert torch.isfinite(v).all()
    for i, n in enumerate(lengths):
        with torch.inference_mode():
            alone = model.velocity(x[i:i + 1, :n], t[i:i + 1], feats[i:i + 1, :n], torch.tensor([n]))[0]
        torch.testing.assert_close(v[i, :n], alone, rtol=0, atol=1e-5 * float(alone.abs().max()))


def _seat_windows(batch, model, lengths, g, device):
    for slot, n in enumerate(lengths):
        x0 = torch.randn(n, model.latent_dim, generator=g)
        feats = torch.randn(n, model.feature_dim, generator=g).to(device)
        batch.seat(slot, x0, feats, None if slot % 3 == 2 else torch.randn(n, model.feature_dim, generator=g).to(device))


@pytest.mark.gpu
def test_step_graphs_equal_the_eager_step_on_cuda(tmp_path):
    """Each (rows, frames) bucket's step replayed from its CUDA graph == the same step run eagerly:
    windows of mixed lengths, each at its own sub-step, guided and not, over a whole grid."""
    from omni.stages.diffusion_batch import WindowBatch
    from omni.stages.ode import RK4, Progress, time_grid

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = Token2Wav.from_checkpoint(make_tiny(tmp_path / "t", seed=1, preset="tiny-a"), device="cuda")
    block, fpt = model.pad_frames, model.frames_per_token
    lengths = [fpt * 3, block + fpt, 2 * block, fpt, 3 * block]
    graphs = WindowBatch(model, RK4, slots=8, frames=3 * block, cuda_graphs=True)
    eager = WindowBatch(model, RK4, slots=8, frames=3 * block, cuda_graphs=False)
    assert graphs.capture_all() == len(graphs.row_sizes) * len(graphs.frame_sizes)
    for batch in (graphs, eager):
        _seat_windows(batch, model, lengths, torch.Generator().manual_seed(0), "cuda")
    grid = time_grid(4, -1.0)
    rows = [Progress(RK4, grid) for _ in lengths]
    for i, p in enumerate(rows):  # staggered: every row at its own sub-step
        for _ in range(i):
            p.advance()
    for _ in range(6):
        params = np.array([(*p.now(), 0.5 if i % 3 != 2 else 0.0) for i, p in enumerate(rows)], dtype=np.float32)
        for batch in (graphs, eager):
            batch.step(params, max(lengths))
        for p in rows:
            p.advance()
    assert graphs.replays == 6 and eager.replays == 0
    for slot, n in enumerate(lengths):
        want = eager.value(slot, 0, n)
        torch.testing.assert_close(graphs.value(slot, 0, n), want, rtol=0, atol=1e-5 * float(want.abs().max()))


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


def _mel_chunks(model, sizes: dict, seed: int = 4) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {name: [torch.randn(n, model.latent_dim, generator=g) - 3 for n in ns] for name, ns in sizes.items()}


def _render_together(model, chunks: dict) -> dict:
    """Every stream's k-th chunk rendered in one call, round after round (as windows finish in a step)."""
    streams, got = {name: model.new_stream({}) for name in chunks}, {n: [] for n in chunks}
    for k in range(max(len(c) for c in chunks.values())):
        names = [n for n in chunks if k < len(chunks[n])]
        outs = model.render([streams[n] for n in names], [chunks[n][k].to(model.device) for n in names],
                            [k == len(chunks[n]) - 1 for n in names])
        for n, out in zip(names, outs):
            if out is not None:
                got[n].append(out["pcm"])
    return {n: np.concatenate(v) for n, v in got.items()}


def test_renders_of_many_streams_in_one_call_equal_each_alone(pair):
    """Windows that finish in one step are vocoded together (padded to shared lengths where their kept
    samples cannot see the padding; a stream's last window alone): each stream's PCM as alone."""
    from omni.models.qwen2_5_omni.modules.token2wav import MelStream

    model = pair[0]
    chunks = _mel_chunks(model, {"a": (48, 72, 72, 30), "b": (48, 72, 11), "c": (24, 40, 72, 72, 72)})
    got = _render_together(model, chunks)
    for n, pieces in chunks.items():
        stream = MelStream(model.code2wav_bigvgan_model, model.vocoder_context)
        with torch.inference_mode():
            want = [stream.push(c, k == len(pieces) - 1) for k, c in enumerate(pieces)]
        w = np.concatenate([p.numpy() for p in want if p is not None])
        np.testing.assert_allclose(got[n], w, rtol=0, atol=1e-5 * np.abs(w).max())


@pytest.mark.gpu
def test_render_graphs_equal_eager_renders_on_cuda(tmp_path):
    """The vocoder's chunk windows replayed from CUDA graphs (rows padded to a captured count) ==
    the same renders run eagerly."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    path = make_tiny(tmp_path / "t", seed=1, preset="tiny-a")
    graphed, eager = (Token2Wav.from_checkpoint(path, device="cuda") for _ in range(2))
    unit = graphed.align_tokens * graphed.frames_per_token
    assert graphed.prepare([2 * unit, 3 * unit, 3 * unit, 3 * unit], 4) > 0  # the schedule the streams below follow
    sizes = {"a": (2 * unit, 3 * unit, 3 * unit, 5), "b": (2 * unit, 3 * unit), "c": (2 * unit, 3 * unit, 3 * unit)}
    got, want = _render_together(graphed, _mel_chunks(graphed, sizes)), _render_together(eager, _mel_chunks(eager, sizes))
    assert graphed.vocoder_graphs.replays > 0
    for n in sizes:
        np.testing.assert_allclose(got[n], want[n], rtol=0, atol=1e-4 * np.abs(want[n]).max())


def test_windows_beyond_the_slots_wait_and_first_windows_go_first(pair):
    """One slot: a stream's next window waits behind another stream's first window (time to first
    audio), and both streams still come out as alone."""
    model = pair[0]
    c_len = 3 * model.align_tokens * 3
    feeds = {rid: _codes(model, c_len, seed=i)[0].numpy() for i, rid in enumerate(("r0", "r1"))}
    stage = _stage(model, max_batch=1, num_steps=3)
    for rid, codes in feeds.items():
        stage.open(rid, {"seed": 7})
        stage.feed(rid, "codes", {"codes": codes})
        stage.close_input(rid)
    out, seated = {rid: [] for rid in feeds}, []
    while stage.has_work():
        for e in stage.step():
            if e.data is not None:
                out[e.rid].append(e.data["pcm"])
        running = [(rid, r.running.window.chunk_start) for rid, r in stage.requests.items() if r.running is not None]
        assert len(running) <= 1
        if running and running[0] not in seated:
            seated.append(running[0])
    assert seated[:3] == [("r0", 0), ("r1", 0), ("r0", stage.chunking.first_chunk)]  # r1's first before r0's second
    for rid, codes in feeds.items():
        alone = _run(_stage(model, num_steps=3), {rid: codes}, {rid: {"seed": 7}})[rid]
        np.testing.assert_allclose(np.concatenate(out[rid]), alone, atol=1e-5 * np.abs(alone).max())


def test_an_unknown_solver_in_a_request_is_refused(pair):
    stage = _stage(pair[0])
    with pytest.raises(InvalidRequest, match="solver"):
        stage.open("a", {"sampling": {"token2wav": {"solver": "dopri5"}}})
