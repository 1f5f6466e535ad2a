"""`omnid`: serve a model over the OpenAI-compatible API, make a tiny test model, list plugins.

    omnid serve [--model DIR|FAMILY] [--host 127.0.0.1] [--port 8000] [--config FILE] [--set k=v ...]
                [--device cuda | --gpus 0,1,2] [--dtype bfloat16] [--served-model-name NAME [ALIAS ...]]
                [--allowed-origins '["*"]'] [--api-key KEY] [--max-concurrent N]    (omnid serve --help: all)
    omnid make-tiny [FAMILY] DIR [the family's flags]    (omnid make-tiny --help lists the families)
    omnid plugins
    omnid sample-speech FILE    (a short real English sentence, bundled: a first transcription's input)
    omnid NAME ...    (commands the families add, e.g. checkpoint converters: omnid --help lists them)
    omnid --version

Nothing here names a family: each registers its make-tiny writer, commands and embedded default
(`omni.models.registry`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

from omni import env
from omni.help_format import DefaultsHelp

log = logging.getLogger("omnid")


def cache_dir() -> Path:
    """Where omnid keeps what it makes (`omni.env.cache_dir`)."""
    return env.cache_dir()


def embedded_default_model() -> tuple[str | None, str | None]:
    """(model_dir, family) served when no --model is given: the model of the family registered as
    the default (made once into the cache dir). `--model demo` serves the weightless demo instead."""
    from omni.models.registry import REGISTRY, check_info, resolve

    entry = REGISTRY.default_model()
    if entry is None:
        raise CliError("no --model given and no family provides a default model")
    try:
        path = resolve(entry.target)(cache_dir())
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot make the embedded {entry.family} model: {exc}") from None
    if path is None:
        raise CliError(f"the embedded {entry.family} model is not available here; use --model DIR")
    _say(f"omnid: no --model given: serving the embedded {entry.family} model from {path} (use --model DIR "
         "for a real checkpoint, --model demo for the demo)")
    return str(path), None


def build_parser() -> argparse.ArgumentParser:
    from omni import __version__
    from omni.models.registry import REGISTRY

    parser = argparse.ArgumentParser(prog="omnid", description="omni's OpenAI-compatible server")
    parser.add_argument("--version", action="version", version=f"omnid {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model", formatter_class=DefaultsHelp)
    add_serve_args(serve)
    # make-tiny and the families' commands parse their own arguments (main passes them on)
    sub.add_parser("make-tiny", add_help=False, help="write a tiny random checkpoint of a family (for tests): "
                   f"[FAMILY] DIR [flags]; families: {', '.join(sorted(REGISTRY.tiny_writers)) or 'none'}")
    sub.add_parser("plugins", help="list installed omni plugins and what they provide")
    sub.add_parser("sample-speech", add_help=False, help="write a short bundled English sentence to FILE "
                   "(a first transcription's input)")
    for command in REGISTRY.commands.values():
        sub.add_parser(command.name, add_help=False, help=command.help)
    return parser


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "--model-path", dest="model", default=None,
                        help="checkpoint directory (config.json + safetensors) or a model family's name "
                             "(`omnid plugins` lists those plugins add); default: the embedded model")
    parser.add_argument("--family", default=None, help="model family, when config.json does not say")
    parser.add_argument("--variant", default=None, help="graph variant of the family (e.g. speech, text); "
                                                         "default: the family's first")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free one)")
    parser.add_argument("--device", default=None,
                        help="device of every GPU-capable stage, e.g. cuda or cuda:1 (per stage: --set NAME.device=...); "
                             "default: the family's (cpu)")
    parser.add_argument("--gpus", default=None, metavar="0,1,2",
                        help="place the GPU stages on these GPUs by memory and load (the heaviest stage alone on "
                             "the first when there are two or more; placement.py); --set NAME.device=cuda:N or NAME.devices=[...] still pins a stage")
    parser.add_argument("--dtype", default=None,
                        help="weights dtype of every GPU-capable stage, e.g. bfloat16 (per stage: --set "
                             "NAME.args.dtype=...); default: the family's")
    parser.add_argument("--quantization", default=None, choices=("fp8",),
                        help="quantize the weights of every stage whose args take a quantization (block-scaled FP8 "
                             "decoder linears) at load; per stage: --set NAME.args.quantization=fp8")
    parser.add_argument("--config", default=None, help="TOML/YAML file of [stages.<name>] overrides")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="STAGE.FIELD=VALUE",
                        help="override one stage field; repeatable")
    parser.add_argument("--api-key", default=env.api_key(),
                        help="require this bearer key (default $OMNI_API_KEY; prefer it or --api-key-file: "
                             "a flag shows in the process list)")
    parser.add_argument("--api-key-file", default=None, help="read the bearer key from this file")
    parser.add_argument("--public-metrics", action="store_true", help="with a key, leave /metrics open")
    parser.add_argument("--header-timeout", type=float, default=10.0,
                        help="seconds a connection may take to send a request head (and stay idle)")
    parser.add_argument("--body-timeout", type=float, default=60.0, help="seconds a request body may take")
    parser.add_argument("--write-timeout", type=float, default=60.0,
                        help="seconds a client of a streamed answer may go without reading")
    parser.add_argument("--max-concurrent", type=int, default=64, help="requests admitted at once (429 beyond)")
    parser.add_argument("--cluster", default=None, metavar="ray[://HOST:PORT]",
                        help="place the stages on a Ray cluster: ray (a local one, or $RAY_ADDRESS), "
                             "ray://HOST:PORT (Ray Client) or ray:HOST:PORT (its GCS address)")
    parser.add_argument("--mode", choices=("process", "inline"), default="process",
                        help="stages as processes (the default) or in this process")
    parser.add_argument("--served-model-name", nargs="+", default=[], metavar="NAME",
                        help="the model's name in the API (replaces the checkpoint's); further names are aliases")
    parser.add_argument("--allowed-origins", default=None, metavar="ORIGINS",
                        help='origins browsers may call from (CORS): a JSON list as in vLLM (\'["*"]\') or '
                             "comma-separated; default: none (no CORS headers)")
    parser.add_argument("--request-timeout", type=float, default=None, help="per-request deadline, seconds")
    parser.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body")
    parser.add_argument("--voice-cache-mb", type=float, default=256.0,
                        help="uploaded voices kept on disk (models that clone voices); past it the least recently "
                             "used are evicted")
    parser.add_argument("--memory-budget-mb", dest="memory_budgets", action="append", default=[],
                        metavar="RESOURCE=MB",
                        help="total memory every client together may hold in one resource: realtime_audio, "
                             "conversation, uploads, output (default: 1/16, 1/16, 1/8 and 1/32 of this machine's "
                             "memory); repeatable")
    parser.add_argument("--max-queued-output-mb", type=float, default=8.0,
                        help="output one connection (HTTP stream or WebSocket) may leave unread before it is cut off")
    parser.add_argument("--max-audio-seconds", type=float, default=600.0, help="longest input audio")
    parser.add_argument("--max-realtime-sessions", type=int, default=256,
                        help="Realtime sessions open at once; a session past it is refused (error event "
                             "`overloaded`, close code 1013) rather than slowing the others")
    parser.add_argument("--image-host", action="append", default=[], help="allow image_url and video_url from this host")
    parser.add_argument("--drain-timeout", type=float, default=30.0, help="seconds to finish requests on stop")
    parser.add_argument("--mps", choices=("auto", "on", "off"), default="auto",
                        help="CUDA MPS for GPU stages sharing a device (auto: when two or more do and "
                             "nvidia-cuda-mps-control is found)")
    parser.add_argument("--no-side-models", action="store_true",
                        help="serve only --model: no real transcriber (registered beside the default) next to a model that "
                             "cannot transcribe truthfully")
    parser.add_argument("--log-level", default="INFO", help="logging level")


class CliError(Exception):
    """A startup problem worth one clear line, not a traceback."""


def config_model_table(path: str | None) -> dict:
    """The `[model]` table of the --config file: family, path, variant (flags win over it)."""
    if not path:
        return {}
    from omni.config import read_config_file

    table = read_config_file(path).get("model", {})
    if not isinstance(table, dict) or set(table) - {"family", "path", "variant"}:
        raise CliError(f"{path}: [model] takes only family, path and variant, got {table!r}")
    return table


def select_model(args: argparse.Namespace, families) -> tuple[str | None, str | None, str | None]:
    """(model_dir, family, variant): `--model` is a checkpoint dir or a registered family's name."""
    try:
        table = config_model_table(args.config)
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read --config: {exc}") from None
    model, family = args.model or table.get("path"), args.family or table.get("family")
    variant = args.variant or table.get("variant")
    if model and not family and model in families and not Path(model).exists():
        model, family = None, model
    if not model and not family:
        model, family = embedded_default_model()
    return model, family, variant


def load_model(args: argparse.Namespace):
    """(graph, info) for --model DIR (or the embedded default), with --config / --set applied."""
    from omni.config import apply_overrides, load_override_file, parse_set_flags
    from omni.models.registry import REGISTRY, check_info, resolve

    for report in REGISTRY.load_plugins():
        if not report.ok:
            _say(f"omnid: plugin {report.name!r} failed to load ({report.error}); serving without it")
    model_dir, family, variant = select_model(args, REGISTRY.families)
    try:
        if family:
            entry = REGISTRY.family_for(name=family)
        else:
            config_path = Path(model_dir) / "config.json"
            if not config_path.is_file():
                raise CliError(f"{model_dir}: no config.json (is --model a checkpoint directory?)")
            archs = json.loads(config_path.read_text()).get("architectures") or []
            entry = REGISTRY.family_for(architectures=archs)
        graph, info = resolve(entry.target)(model_dir, variant, **family_options(args))
        if getattr(args, "quantization", None):
            set_quantization(graph, args.quantization)
        overrides = load_override_file(args.config) if args.config else {}
        for stage, fields in parse_set_flags(args.sets).items():
            overrides.setdefault(stage, {}).update(fields)
        if overrides:
            apply_overrides(graph, overrides)
            if entry.settle:  # what follows from the overridden args (e.g. the thinker's context)
                resolve(entry.settle)(graph, info)
        check_info(graph, info)
        if args.gpus:
            from omni.placement import parse_gpus, place

            # "device=cuda" only says "a GPU" (the plan picks which); "cuda:N", "cpu" or `devices` pin the stage
            pinned = {name for name, fields in overrides.items()
                      if "devices" in fields or fields.get("device", "cuda") != "cuda"}
            place(graph, parse_gpus(args.gpus), keep=pinned)
    except CliError:
        raise
    except (ValueError, OSError, KeyError, ImportError) as exc:  # GraphError is a ValueError
        raise CliError(f"cannot load the model: {exc}") from None
    return graph, info


def set_quantization(graph, method: str) -> None:
    """--quantization: the args of every stage whose kind's args declare `quantization`."""
    from omni.kernel.registry import STAGES

    named = []
    for spec in graph.stages:
        cls = STAGES.stage_args_class(spec.kind)
        if cls is not None and "quantization" in {f.name for f in dataclasses.fields(cls)}:
            spec.args["quantization"] = method
            named.append(spec.name)
    if not named:
        raise CliError(f"--quantization {method}: no stage of this model takes a quantization")


def family_options(args: argparse.Namespace) -> dict:
    """--device / --dtype as the family builder's options: each family knows which of its stages
    run on a GPU (a preprocess stage stays on the CPU)."""
    device = args.device or ("cuda" if getattr(args, "gpus", None) else None)  # --gpus: the GPU stages, placed later
    return {k: v for k, v in (("device", device), ("dtype", args.dtype)) if v}


def allowed_origins(text: str | None) -> list[str]:
    """vLLM's JSON list ('["*"]') or a comma-separated list."""
    if not text:
        return []
    if text.lstrip().startswith("["):
        try:
            origins = json.loads(text)
        except ValueError as exc:
            raise CliError(f"--allowed-origins is not a JSON list: {exc}") from None
        if not isinstance(origins, list) or not all(isinstance(o, str) for o in origins):
            raise CliError("--allowed-origins must be a JSON list of strings")
        return origins
    return [o.strip() for o in text.split(",") if o.strip()]


def check_port_free(host: str, port: int) -> None:
    """Fail in one line, before any stage loads, when host:port cannot be listened on."""
    import socket

    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc}") from None
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
            try:
                sock.bind(addr)
            except OSError as exc:
                raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (is another server "
                               "running there? pick another --port)") from None


def server_config(args: argparse.Namespace):
    from omni.api.app import ServerConfig
    from omni.api.media import MediaLimits

    return ServerConfig(host=args.host, port=args.port, api_key=api_key(args),
                        public_metrics=args.public_metrics, header_timeout_s=args.header_timeout,
                        body_timeout_s=args.body_timeout, write_timeout_s=args.write_timeout,
                        max_body_bytes=int(args.max_body_mb * (1 << 20)),
                        limits=MediaLimits(max_audio_seconds=args.max_audio_seconds, image_hosts=args.image_host),
                        request_timeout_s=args.request_timeout, drain_timeout_s=args.drain_timeout,
                        budgets=memory_budgets(args.memory_budgets),
                        max_queued_output_bytes=int(args.max_queued_output_mb * (1 << 20)),
                        max_realtime_sessions=args.max_realtime_sessions,
                        model_aliases=args.served_model_name[1:],
                        voice_dir=str(cache_dir() / "voices"), voice_cache_bytes=int(args.voice_cache_mb * (1 << 20)),
                        allowed_origins=allowed_origins(args.allowed_origins))


def memory_budgets(flags: list[str]) -> dict[str, int]:
    """--memory-budget-mb RESOURCE=MB flags over the defaults derived from this machine's memory."""
    from omni.api.budgets import DEFAULT_SHARES, default_limits

    limits = default_limits()
    for flag in flags:
        name, sep, value = flag.partition("=")
        if not sep or name.strip() not in DEFAULT_SHARES:
            raise CliError(f"--memory-budget-mb takes RESOURCE=MB with RESOURCE one of {', '.join(DEFAULT_SHARES)}, "
                           f"not {flag!r}")
        try:
            mb = float(value)
        except ValueError:
            mb = float("nan")
        if not mb > 0 or mb == float("inf"):  # nan and inf too: a budget of 0 would refuse every client
            raise CliError(f"--memory-budget-mb {flag!r}: {value!r} is not a positive number of MB")
        limits[name.strip()] = int(mb * (1 << 20))
    return limits


def api_key(args: argparse.Namespace) -> str | None:
    """--api-key-file, else --api-key / $OMNI_API_KEY; surrounding whitespace is not part of a key."""
    if args.api_key_file:
        try:
            key = Path(args.api_key_file).read_text().strip()
        except OSError as exc:
            raise CliError(f"cannot read --api-key-file: {exc}") from None
        if not key:
            raise CliError(f"--api-key-file {args.api_key_file} is empty")
        return key
    return (args.api_key or "").strip() or None


def _say(text: str) -> None:
    print(text, flush=True)


async def serve(args: argparse.Namespace) -> None:
    from omni.gpu_env import keep_multicast_off

    keep_multicast_off()  # every process the server starts inherits it
    check_port_free(args.host, args.port)
    config = server_config(args)  # first: a bad key file fails before any stage starts
    _say("omnid: loading model " + (args.model or "(embedded default)"))
    graph, info = load_model(args)
    if args.served_model_name:
        info = dataclasses.replace(info, id=args.served_model_name[0])
    stages = [s.name for s in graph.stages]
    _say(f"omnid: model {info.id!r} (family {info.family}), {len(stages)} stage(s): {', '.join(stages)}")
    if info.random_weights:
        log.warning("model %r has RANDOM weights: its text and speech are noise (fine for tests, not for use)",
                    info.id)
    from omni.api.mps import MPSError, start_mps

    from omni.placement import process_devices

    devices = process_devices(graph)
    try:  # before any stage process starts: they inherit its pipe directory
        mps = start_mps(getattr(args, "mps", "off") if args.mode == "process" else "off", devices)
    except MPSError as exc:
        raise CliError(str(exc)) from None
    if mps is not None:
        _say("omnid: CUDA MPS on for the GPU stages sharing a device")
    try:
        await _serve_graph(args, graph, info, stages, config)
    finally:
        if mps is not None:
            mps.stop()


async def _serve_graph(args: argparse.Namespace, graph, info, stages: list[str], config) -> None:
    from omni.api.app import STATE, ServedModel, build_app
    from omni.api.server import HttpServer, serve_until_signal
    from omni.kernel.errors import StageStartError
    from omni.kernel.kernel import Kernel

    host = None
    if args.cluster:
        from omni.cluster.ray_host import RayHost, parse_cluster

        try:
            host = RayHost(parse_cluster(args.cluster))
        except (ValueError, ConnectionError, RuntimeError) as exc:
            raise CliError(f"--cluster {args.cluster}: {exc}") from None
        _say(f"omnid: stages on the Ray cluster {args.cluster} (bus on {host.bus_host})")
    kernel = Kernel(graph, mode=args.mode, max_inflight=args.max_concurrent, host=host)
    _say(f"omnid: starting {len(stages)} stage(s) ({args.mode} mode) ...")
    try:
        await kernel.start()
    except StageStartError as exc:
        await kernel.stop()
        raise CliError(f"a stage did not start: {exc}") from None
    _say("omnid: stages up: " + ", ".join(f"{k}={v}" for k, v in kernel.health().items()))
    extras: list[ServedModel] = []
    for extra_graph, extra_info in embedded_extra_models(args, info):
        extra = Kernel(extra_graph, mode=args.mode, max_inflight=args.max_concurrent)
        try:
            await extra.start()
        except StageStartError as exc:
            await extra.stop()
            log.warning("not serving %s: a stage did not start: %s", extra_info.id, exc)
            continue
        extras.append(ServedModel(extra, extra_info, [s.name for s in extra_graph.stages]))
        _say(f"omnid: also serving {extra_info.id!r} (family {extra_info.family})")
    app = build_app(kernel, info, stages, config, extra_models=extras)
    for line in app[STATE].who_serves():
        _say("omnid: " + line)
    server = HttpServer(app, config.host, config.port)
    await serve_until_signal(server, _Kernels([kernel, *(m.kernel for m in extras)]), config.drain_timeout_s,
                             on_listening=_say)


def _run(coro) -> None:
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:
        asyncio.run(coro)


def make_tiny(argv: list[str]) -> int:
    """`make-tiny [FAMILY] DIR [flags]`: FAMILY is the first word when it names a family (or another
    word follows it); without one, the default model's family. The family's writer parses the rest."""
    from omni.models.registry import REGISTRY

    writers = REGISTRY.tiny_writers
    default = REGISTRY.default_model()
    fallback = default.family if default is not None and default.family in writers else None
    known = ", ".join(sorted(writers)) or "none"
    if not argv or argv[0] in ("-h", "--help"):
        _say(f"usage: omnid make-tiny [FAMILY] DIR [flags]\nfamilies: {known}"
             + (f" (default: {fallback})" if fallback else "") + "\nomnid make-tiny FAMILY --help: its flags")
        return 0 if argv else 2
    first_is_family = argv[0] in writers or argv[0] in REGISTRY.families or (
        len(argv) > 1 and not argv[0].startswith("-") and not argv[1].startswith("-"))
    family, rest = (argv[0], argv[1:]) if first_is_family else (fallback, argv)
    if family not in writers:
        raise CliError(f"make-tiny knows the families {known}, not {family!r}" if family else
                       f"make-tiny needs a FAMILY: one of {known}")
    return run_family_main("make-tiny", writers[family], rest)


def run_family_main(command: str, target: str, argv: list[str]) -> int:
    """Run a family's `main(argv)`; what it raises for bad input is one line, not a traceback."""
    from omni.kernel.registry import resolve

    try:
        main = resolve(target)
    except ImportError as exc:
        raise CliError(f"{command} is not available in this build: {exc}") from None
    try:
        return int(main(argv) or 0)
    except (ValueError, KeyError, OSError) as exc:
        raise CliError(f"{command} failed: {exc}") from None


def embedded_extra_models(args: argparse.Namespace, info=None) -> list[tuple]:
    """(graph, info) of the models served beside the main one (`info`; None: the embedded default):
    each family registered `beside` (a real transcriber) whose model is available here, whenever the
    main model cannot transcribe truthfully itself (it does not transcribe, or its weights are
    random), so that `whisper-1` never names noise. `--no-side-models`: none."""
    from omni.models.registry import REGISTRY, check_info, resolve

    if getattr(args, "no_side_models", False) or (info is not None and info.transcribes and not info.random_weights):
        return []
    models = []
    for entry in REGISTRY.defaults:
        if not entry.beside or (info is not None and info.family == entry.family):
            continue
        try:
            path = resolve(entry.target)(cache_dir())
            if path is not None:
                models.append(resolve(REGISTRY.family_for(name=entry.family).target)(str(path), None,
                                                                                      **family_options(args)))
        except (ValueError, OSError) as exc:
            log.warning("not serving the embedded %s model: %s", entry.family, exc)
    return models


class _Kernels:
    """Stops every served model's kernel (what serve_until_signal stops at the end)."""

    def __init__(self, kernels: list) -> None:
        self.kernels = kernels

    def end_requests(self, reason: str) -> None:
        for kernel in self.kernels:
            kernel.end_requests(reason)

    async def stop(self) -> None:
        for kernel in self.kernels:
            await kernel.stop()


def list_plugins(args: argparse.Namespace) -> None:
    from omni.models.registry import REGISTRY

    reports = REGISTRY.load_plugins()
    if not reports:
        _say("no omni plugins installed")
    for r in reports:
        status = "ok" if r.ok else f"FAILED: {r.error}"
        _say(f"{r.name}: {status}" + (f"; provides {', '.join(r.provides)}" if r.provides else ""))


def exit_without_finalizing(code: int) -> None:
    """Leave now, past the atexit handlers (logging's flush, finalizers) and the flush of stdio, but
    without the interpreter's teardown of every module: torch's alone takes ~0.5 s on a small
    machine, which put omnid's exit past --drain-timeout after a clean shutdown."""
    import atexit
    import os

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    from omni.models.registry import REGISTRY

    argv_given, argv = argv, list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("serve", "plugins"):  # (those two load them and report failures)
        REGISTRY.load_plugins()  # their commands and make-tiny writers
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    passes_on = args.command in ("make-tiny", "sample-speech") or args.command in REGISTRY.commands
    if unknown and not passes_on:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(level=getattr(args, "log_level", "INFO").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        if args.command == "serve":
            _run(serve(args))
            if argv_given is None:  # omnid the program (not a caller's main([...])): every stage has stopped
                exit_without_finalizing(0)
        elif args.command == "make-tiny":
            return make_tiny(argv[1:])
        elif args.command == "plugins":
            list_plugins(args)
        elif args.command == "sample-speech":
            return run_family_main("sample-speech", "omni.api.sample_speech:main", argv[1:])
        else:
            return run_family_main(args.command, REGISTRY.commands[args.command].target, argv[1:])
    except CliError as exc:
        print(f"omnid: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
