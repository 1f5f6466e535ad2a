"""`omnid` as a vLLM user expects it: the port checked before any stage loads, --version, defaults
in --help, --device / --dtype for every GPU-capable stage, --served-model-name replacing the name,
--allowed-origins, and the random-weights warning said once."""

from __future__ import annotations

import socket

import openai
import pytest
import requests

from omni import __version__
from omni.api.cli import build_parser, load_model
from test_api_cli import omnid, read_until_listening


def test_busy_port_fails_in_one_line_before_loading_anything():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = omnid("serve", "--model", "demo", "--port", str(port))
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert f"omnid: error: cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err
    assert "loading model" not in out and "starting" not in out


def test_version_and_defaults_in_help(capsys):
    proc = omnid("--version")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.strip() == f"omnid {__version__}"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--port PORT port to listen on (0: any free one) (default: 8000)",
                 "--host HOST address to listen on (default: 127.0.0.1)", "(default: 64)", "--device DEVICE",
                 "--dtype DTYPE", "--served-model-name NAME [NAME ...]", "--allowed-origins ORIGINS"):
        assert flag in text
    assert "(default: None)" not in text and "(default: [])" not in text and "(default: False)" not in text
    assert "default: the family's first (default" not in text  # a text that states its default says it once


def test_api_key_never_shows_in_help(capsys, monkeypatch):
    monkeypatch.setenv("OMNI_API_KEY", "sekrit-key")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    assert "sekrit-key" not in capsys.readouterr().out


def test_make_tiny_qwen3_tts_help_describes_every_flag(capsys):
    from omni.models.qwen3_tts.checkpoint.make_tiny import main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("DIR the checkpoint directory to write", "voice-design: the voice described in instructions",
                  "full-1.7b (the published size) (default: tiny-a)", "--seed SEED seed of the random weights"):
        assert words in text


@pytest.mark.parametrize("family", ["qwen3-omni", "qwen3-tts"])
def test_make_tiny_help_describes_every_flag_and_says_each_default_once(capsys, family):
    """Every argument of `omnid make-tiny FAMILY --help` has a description; a default is told where
    it says something (0 too), never as "(default: False)" / "(default: None)"."""
    import argparse

    from omni.models.qwen3_omni.checkpoint import make_tiny as omni_tiny
    from omni.models.qwen3_tts.checkpoint import make_tiny as tts_tiny

    made: list[argparse.ArgumentParser] = []
    real = argparse.ArgumentParser.parse_args

    def spy(self, *args, **kwargs):
        made.append(self)
        return real(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp, pytest.raises(SystemExit):
        mp.setattr(argparse.ArgumentParser, "parse_args", spy)
        (omni_tiny if family == "qwen3-omni" else tts_tiny).main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    [parser] = made
    for action in parser._actions:
        assert action.help, f"{family}: {action.option_strings or action.dest} has no description"
    assert "--seed SEED seed of the random weights (default: 0)" in text
    assert "(default: False)" not in text and "(default: None)" not in text
    assert text.count("(default: tiny-a)") == 1


def test_help_formatter_shows_a_zero_default_and_hides_empty_ones():
    import argparse

    from omni.help_format import DefaultsHelp

    parser = argparse.ArgumentParser(formatter_class=DefaultsHelp)
    parser.add_argument("--zero", type=int, default=0, help="a count")
    parser.add_argument("--off", action="store_true", help="a switch")
    parser.add_argument("--said", default="x", help="a name (default: x, the first)")
    text = " ".join(parser.format_help().split())
    assert "--zero ZERO a count (default: 0)" in text and "--off a switch --said" in text
    assert text.count("default: x") == 1


def test_tiny_random_models_load_without_alarming_warnings(tmp_path, caplog):
    """A tiny random Qwen3-Omni's tied router rows are by design (no warning), and transformers'
    harmless config warnings of both families are dropped; other transformers messages pass."""
    import logging

    from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
    from omni.models.qwen3_omni.modules.talker import TalkerModel
    from omni.models.qwen3_tts.checkpoint.make_tiny import make_tiny as make_tiny_tts
    from omni.models.qwen3_tts.config import load_config as tts_config
    import omni.models.qwen3_tts  # noqa: F401 (its filters)

    from transformers import AutoConfig

    class Keep(logging.Handler):  # transformers' loggers do not propagate to pytest's
        def emit(self, record: logging.LogRecord) -> None:
            caplog.records.append(record)

    tiny = make_tiny(tmp_path / "tiny", seed=1, preset="tiny-b")
    tts = make_tiny_tts(tmp_path / "tts", "custom-voice", "tiny-a", seed=0)
    keep = Keep()
    logging.getLogger("transformers").addHandler(keep)
    try:
        with caplog.at_level(logging.INFO):
            model = TalkerModel.from_checkpoint(tiny)
            AutoConfig.from_pretrained(str(tiny))
            tts_config(tts)
            logging.getLogger("transformers.configuration_utils").warning(  # what transformers says of its config
                "You are using a model of type `qwen3_tts` to instantiate a model of type ``. This may be expected")
            logging.getLogger("transformers.modeling_rope_utils").warning("Something else entirely")
    finally:
        logging.getLogger("transformers").removeHandler(keep)
    warnings = {r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING}  # a record may come twice
    assert warnings == {"Something else entirely"}, warnings
    if model.router_ties():  # said, but quietly
        assert any("router rows repeat" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_device_and_dtype_reach_every_gpu_capable_stage(tmp_path):
    from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny
    from test_whisper_support import tiny_random_checkpoint

    tiny = make_tiny(tmp_path / "tiny", seed=0, preset="tiny-a")
    args = build_parser().parse_args(["serve", "--model", str(tiny), "--device", "cuda:1", "--dtype", "bfloat16",
                                      "--set", "talker.device=cuda:0"])
    graph, _ = load_model(args)
    devices = {s.name: s.device for s in graph.stages}
    assert devices == {"preprocess": "cpu", "audio_encoder": "cuda:1", "vision_encoder": "cuda:1",
                       "thinker": "cuda:1", "talker": "cuda:0", "code2wav": "cuda:1"}  # --set wins
    assert all(s.args["dtype"] == "bfloat16" for s in graph.stages if s.name != "preprocess")
    whisper = tiny_random_checkpoint(tmp_path / "whisper-random")
    graph, _ = load_model(build_parser().parse_args(["serve", "--model", str(whisper), "--device", "cuda",
                                                     "--dtype", "float16"]))
    assert {(s.device, s.args["dtype"]) for s in graph.stages} == {("cuda", "float16")}
    graph, _ = load_model(build_parser().parse_args(["serve", "--model", str(whisper)]))
    assert {(s.device, s.args["dtype"]) for s in graph.stages} == {("cpu", "float32")}  # the family's defaults


def test_gpus_places_the_stages_and_set_still_pins_one(tmp_path):
    from omni.api.cli import CliError
    from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny

    tiny = make_tiny(tmp_path / "tiny", seed=0, preset="tiny-a")
    args = build_parser().parse_args(["serve", "--model", str(tiny), "--gpus", "0,1,2", "--set", "talker.replicas=2",
                                      "--set", "code2wav.device=cuda:5", "--set", "thinker.device=cuda"])
    graph, _ = load_model(args)
    devices = {s.name: s.all_devices() for s in graph.stages}
    assert devices["preprocess"] == ["cpu"] and devices["thinker"] == ["cuda:0"]
    assert sorted(devices["talker"]) == ["cuda:1", "cuda:2"] and devices["code2wav"] == ["cuda:5"]
    assert {devices["audio_encoder"][0], devices["vision_encoder"][0]} <= {"cuda:1", "cuda:2"}
    with pytest.raises(CliError, match="--gpus"):
        load_model(build_parser().parse_args(["serve", "--model", str(tiny), "--gpus", "0,0"]))


def test_served_model_name_replaces_the_name_and_cors_is_on():
    proc = omnid("serve", "--model", "demo", "--port", "0", "--mode", "inline", "--served-model-name", "mine",
                 "also-mine", "--allowed-origins", '["*"]')
    try:
        url, lines = read_until_listening(proc)
        assert "omnid: model 'mine' (family demo)" in "\n".join(lines)
        resp = requests.get(url + "/v1/models", headers={"Origin": "http://x.example"}, timeout=10)
        names = [m["id"] for m in resp.json()["data"]]
        assert names[:2] == ["mine", "also-mine"] and "omni-demo" not in names
        assert resp.headers["Access-Control-Allow-Origin"] == "*"
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)
        answer = client.chat.completions.create(model="mine", messages=[{"role": "user", "content": "hi"}],
                                                extra_body={"stage_sampling": {"generator": {"max_tokens": 3}}})
        assert answer.model == "mine" and len(answer.choices[0].message.content) == 3
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="omni-demo", messages=[{"role": "user", "content": "hi"}])
    finally:
        proc.terminate()
        proc.wait(30)
    err = proc.stderr.read()
    assert err.count("RANDOM weights") == 1, err  # said once


def test_bad_allowed_origins_is_one_line():
    proc = omnid("serve", "--model", "demo", "--port", "0", "--allowed-origins", "[not json")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--allowed-origins is not a JSON list" in err


def test_set_thinker_max_model_len_bounds_the_prompt_and_the_model_card(tmp_path):
    """#27: `--set thinker.args.max_model_len=N` is the one setting of the thinker's context: the
    preprocess stage's prompt bound and ModelInfo.max_context follow it."""
    from omni.kernel.graph import stage_args
    from omni.models.qwen3_omni.checkpoint.make_tiny import make_tiny

    tiny = make_tiny(tmp_path / "tiny", seed=0, preset="tiny-a")
    default_graph, default_info = load_model(build_parser().parse_args(["serve", "--model", str(tiny)]))
    assert default_info.max_context == stage_args(default_graph.stage("thinker")).max_model_len
    graph, info = load_model(build_parser().parse_args(["serve", "--model", str(tiny), "--set",
                                                        "thinker.args.max_model_len=512"]))
    assert stage_args(graph.stage("thinker")).max_model_len == 512
    assert stage_args(graph.stage("preprocess")).max_prompt_tokens == 512
    assert info.max_context == 512
