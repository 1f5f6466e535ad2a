"""The demo family: the weightless toy pipeline of `stages.py` (encoder -> generator -> vocoder),
served by `omnid serve --model demo` and used by the kernel's tests (`stages.demo_graph`)."""

# its stage kinds, named once and registered here (stages.py loads the registry, so the kernel's table has them)
KINDS = {"demo.encoder": "omni.models.demo.stages:ToyEncoder", "demo.generator": "omni.models.demo.stages:ToyGenerator",
         "demo.vocoder": "omni.models.demo.stages:ToyVocoder"}


def register(registry) -> None:
    for kind, target in KINDS.items():
        registry.register_stage(kind, target)
    registry.register_family("demo", "omni.models.demo.graph:build_demo", ["OmniDemo"])
