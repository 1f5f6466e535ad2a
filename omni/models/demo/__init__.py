"""The demo family: the weightless toy pipeline of omni/stages/demo.py (encoder -> generator ->
vocoder), served by `omnid serve --model demo` and used by the kernel's tests."""


def register(registry) -> None:
    registry.register_stage("demo.encoder", "omni.stages.demo:ToyEncoder")
    registry.register_stage("demo.generator", "omni.stages.demo:ToyGenerator")
    registry.register_stage("demo.vocoder", "omni.stages.demo:ToyVocoder")
    registry.register_family("demo", "omni.models.demo.graph:build_demo", ["OmniDemo"])
