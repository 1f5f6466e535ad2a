"""omni-example: the smallest useful omni plugin.

omni calls `register(registry)` at startup (entry point group `omni.plugins`). Targets are
`module:attr` strings, imported only where they are used (the API process imports the family,
each stage process imports only its stage class). `args=` names the stage kind's typed args (a
dataclass in a torch-free module): omni checks a graph's args against it when the graph is built,
so a misspelt `--set reverse.args.uper=true` fails then. A kind registered without `args=` takes
free-form dict args instead (`ctx.args` is the dict, unchecked).
"""

from __future__ import annotations

FAMILY = "example-reverse"
ARCHITECTURE = "OmniExampleReverser"  # a checkpoint whose config.json names this is served by the family


def register(registry) -> None:
    registry.register_stage("example.reverse", "omni_example.reverse:ReverseStage", args="omni_example.reverse:ReverseArgs")
    registry.register_family(FAMILY, "omni_example.reverse:build", [ARCHITECTURE], tasks=["chat"])
