"""Third-party engines omni embeds. Each submodule is the ONLY place that imports its engine's
internals, so a version bump touches one file (`omni.vendor.sglang` for SGLang)."""
