"""One entry point for the benchmarks users run: `python -m bench` lists them, `python -m bench NAME
[ARGS...]` runs one (ARGS go to the script unchanged; `python -m bench NAME --help` shows them).

Each benchmark is still a plain script (`python bench/serve.py ...` works the same): this runs that
file as `__main__` with `sys.argv` set as if it had been started directly, so the script's own
`sys.path` setup, defaults and exit status are unchanged. The one-off H200 device recipes that call
these scripts are in bench/h200/README.md; the figures they produced are in bench/RESULTS.md.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (script in bench/, one line: what it measures). The first six are the user-facing ones
# (issue 27); the rest are the suites that start their own omnid on a GPU and drive the first six.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "serve": ("serve.py", "load generator for any OpenAI-compatible chat server: TTFT, TPOT, TTFA, RTF per concurrency"),
    "tts": ("tts.py", "Qwen3-TTS on one GPU: omnid over HTTP vs the reference package's generate (TTFA, RTF, audio s/s)"),
    "realtime": ("realtime.py", "voice conversations over /v1/realtime: end of speech -> first audio per turn"),
    "whisper": ("whisper.py", "Whisper on CPU: omni's graph vs transformers' ASR pipeline, same speech, same run"),
    "equal-work": ("equal_work.py", "omni's built-in engine vs SGLang on the same weights, prompts and output lengths"),
    "transport": ("transport.py", "what the payload channels (shm, cuda_ipc, ...) cost against a plain memcpy"),
    "gpu-suite": ("gpu_suite.py", "fresh omnid on full-size Qwen3-Omni (random weights) under `serve`, vs transformers"),
    "realtime-suite": ("realtime_suite.py", "fresh omnid on full-size Qwen3-Omni under `realtime`: cold, warm levels"),
    "timeline": ("timeline.py", "where every millisecond goes: each stage's idle/feed/step/emit shares per level"),
    "soak": ("soak.py", "mixed traffic for a chosen time; RSS and open fds of every process, first vs last minute"),
}


def listing() -> str:
    width = max(map(len, BENCHMARKS))
    lines = ["usage: python -m bench NAME [ARGS...]   (python -m bench NAME --help for its arguments)", ""]
    lines += [f"  {name:<{width}}  {desc}   [bench/{script}]" for name, (script, desc) in BENCHMARKS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return 0
    name = argv[0].replace("_", "-")
    if name not in BENCHMARKS:
        import difflib

        close = difflib.get_close_matches(name, BENCHMARKS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"unknown benchmark {argv[0]!r}{hint}\n\n{listing()}", file=sys.stderr)
        return 2
    script = HERE / BENCHMARKS[name][0]
    sys.argv = [str(script), *argv[1:]]
    sys.path.insert(0, str(HERE))  # as `python bench/x.py` has it: the script's folder first
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:  # the script's own exit status
        code = exc.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
