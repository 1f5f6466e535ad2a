"""omni-example: the smallest useful omni plugin.

omni calls `register(registry)` at startup (entry point group `omni.plugins`). Targets are
`module:attr` strings, imported only where they are used (the API process imports the family,
each stage process imports only its stage class).
"""

from __future__ import annotations

FAMILY = "example-reverse"
ARCHITECTURE = "OmniExampleReverser"  # a checkpoint whose config.json names this is served by the family


def register(registry) -> None:
    registry.register_stage("example.reverse", "omni_example.reverse:ReverseStage")
    registry.register_family(FAMILY, "omni_example.reverse:build", [ARCHITECTURE], tasks=["chat"])
