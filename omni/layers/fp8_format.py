"""The fine-grained FP8 weight format, as a checkpoint's config.json declares it, and the refusal
of every `quantization_config` omni cannot honour (torch-free: stage args and configs read it).

The format is the one Qwen publishes for its MoE models (DeepSeek-V3's, which SGLang and vLLM
load): `quant_method: "fp8"`, `fmt: "e4m3"`, `activation_scheme: "dynamic"`, `weight_block_size:
[128, 128]`; each converted linear's `weight` is float8_e4m3fn and its `weight_scale_inv` float32
holds one multiplier per 128x128 block (weight ~= e4m3 * scale_inv); `modules_to_not_convert`
names modules kept in bf16. Anything else (another method, static activations, other blocks)
would be read as raw numbers, so it is refused at load instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from omni.kernel.errors import OmniError

QUANT_KEY = "quantization_config"
BLOCK = (128, 128)
METHODS = ("fp8",)  # what a stage's `quantization` arg may ask for ("" = the checkpoint's own)
_KNOWN_KEYS = {"quant_method", "fmt", "activation_scheme", "weight_block_size", "modules_to_not_convert",
               "ignored_layers"}


class QuantizationError(OmniError, ValueError):
    """A quantization omni cannot honour (named by the checkpoint or the stage args)."""

    kind = "checkpoint"


@dataclass(frozen=True)
class Fp8Format:
    """Block-scaled e4m3 weights with activations quantized per token group at run time."""

    block: tuple[int, int] = BLOCK
    not_convert: tuple[str, ...] = ()

    def to_config(self) -> dict[str, Any]:
        """The published `quantization_config` of this format."""
        out: dict[str, Any] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                               "weight_block_size": list(self.block)}
        if self.not_convert:
            out["modules_to_not_convert"] = list(self.not_convert)
        return out

    def converts(self, module: str) -> bool:
        """False when `module` (a dotted name, any prefix) is one `modules_to_not_convert` names:
        the entry itself, a module under it, or the same path under a part prefix (`thinker.`);
        `*` matches within names."""
        for entry in self.not_convert:
            for pattern in (entry, entry + ".*", "*." + entry, "*." + entry + ".*"):
                if fnmatchcase(module, pattern):
                    return False
        return True


def parse(qc: Any, where: str = "config.json") -> Fp8Format:
    """`qc` (a `quantization_config` dict) as an Fp8Format; QuantizationError for anything else."""
    if not isinstance(qc, dict):
        raise QuantizationError(f"{where}: quantization_config must be a table, got {type(qc).__name__}")
    method = qc.get("quant_method")
    if method != "fp8":
        raise QuantizationError(f"{where}: quantization {method!r} is not supported (omni loads only "
                                f"fine-grained FP8: quant_method 'fp8', e4m3 weights, 128x128 block scales)")
    unknown = sorted(set(qc) - _KNOWN_KEYS)
    if unknown:
        raise QuantizationError(f"{where}: FP8 quantization_config has keys omni does not know: {unknown}")
    if qc.get("fmt", "e4m3") != "e4m3":
        raise QuantizationError(f"{where}: FP8 fmt {qc['fmt']!r} is not supported (only e4m3)")
    if qc.get("activation_scheme", "dynamic") != "dynamic":
        raise QuantizationError(f"{where}: FP8 activation_scheme {qc['activation_scheme']!r} is not supported "
                                "(only dynamic: activations are quantized per token group at run time)")
    block = qc.get("weight_block_size")
    if block is None or list(block) != list(BLOCK):
        raise QuantizationError(f"{where}: FP8 weight_block_size {block!r} is not supported (only {list(BLOCK)}; "
                                "per-tensor FP8 is not)")
    keep = list(qc.get("modules_to_not_convert") or []) + list(qc.get("ignored_layers") or [])
    if not all(isinstance(k, str) for k in keep):
        raise QuantizationError(f"{where}: modules_to_not_convert must be a list of module names")
    return Fp8Format(tuple(block), tuple(keep))


def _found(node: Any, path: str) -> list[tuple[str, Any]]:
    """Every `quantization_config` in a config tree, with where it sits."""
    if not isinstance(node, dict):
        return []
    out = [(path or "config.json", node[QUANT_KEY])] if QUANT_KEY in node else []
    for key, value in node.items():
        if key != QUANT_KEY and isinstance(value, dict):
            out += _found(value, f"{path}.{key}" if path else key)
    return out


def checkpoint_format(raw: dict[str, Any], where: str = "config.json") -> Fp8Format | None:
    """The FP8 format a whole config.json declares (top level, or any sub-config: the thinker's or
    talker's `text_config`), None when it declares none. Every declaration must be one omni
    honours, and all of them the same format."""
    formats = {parse(qc, f"{where} ({at})") for at, qc in _found(raw, "")}
    if len(formats) > 1:
        raise QuantizationError(f"{where}: sub-configs declare different FP8 formats: {sorted(map(repr, formats))}")
    return next(iter(formats), None)


def requested(method: str | None) -> Fp8Format | None:
    """A stage's `quantization` arg: "" = none asked (the checkpoint's own), "fp8" = quantize at load."""
    if not method:
        return None
    if method not in METHODS:
        raise QuantizationError(f"quantization {method!r} is not supported; expected one of {METHODS} or ''")
    return Fp8Format()
