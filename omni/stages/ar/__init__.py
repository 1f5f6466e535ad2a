"""The built-in autoregressive engine: paged KV cache, continuous batching, chunked prefill.

Import the pieces from their modules (`omni.stages.ar.engine.AREngine`,
`omni.stages.ar.model_api.ARModel`, `omni.stages.ar.stage.ARStage`); this package
imports nothing so that `import omni.stages.ar` stays cheap.
"""
