"""A Qwen3-MoE text checkpoint on disk that both omni's built-in engine and SGLang load.

Why: a peer comparison is only fair on equal work. With SGLang's `load_format="dummy"` and omni's
`load_format="random"` the two engines run different weights, so their routers can spread the
same tokens over very different numbers of experts. Here one set of seeded random bf16 weights is
written once, in the layout every Qwen3-MoE loader reads (`Qwen3MoeForCausalLM`: per-expert
`mlp.experts.E.{gate,up,down}_proj.weight`, `mlp.gate.weight`, q/k norms), and both engines load
those same tensors:

- SGLang (or transformers) loads the directory as it loads any Qwen3-MoE checkpoint;
- omni loads it with `load_text_thinker(dir)`: the Qwen3-MoE config becomes a thinker config (for
  text-only prompts the thinker's M-RoPE equals Qwen3-MoE's 1-D rope, see export_text.py) and the
  tensors go through the thinker's own name mapping (`text_state_dict`) onto `Qwen3OmniThinker`,
  the module omni's AR engine runs for the thinker.

`write_text_checkpoint(out, layers=8)` writes the published thinker's width (hidden 2048, 128
experts top-8, moe_intermediate 768, 32/4 heads, head_dim 128, vocabulary 152,064 as in
presets_full) at a reduced depth: one safetensors shard per decoder layer plus one for the
embedding, final norm and lm_head, with `model.safetensors.index.json`. Weights are N(0, std)
drawn in a fixed order from one generator seeded by `seed` on `device` (the same seed gives the
same weights on the same kind of device); norm weights are 1. 8 layers: 5.5B parameters, 10.9 GB.

    python -m omni.models.qwen3_omni.checkpoint.text_checkpoint OUT [--layers 8] [--seed 0] [--device cuda]
    python -m omni.models.qwen3_omni.checkpoint.text_checkpoint OUT --scaled        # test sizes (CPU)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

from omni.layers.rotary import rope_inv_freq
from omni.models.qwen3_omni.config import ThinkerConfig, _thinker
from omni.models.qwen3_omni.checkpoint.export_text import per_expert_names, qwen3_moe_config
from omni.models.weights import CheckpointError, INDEX_FILE, load_state_dict

DEFAULT_STD = 0.02
MARKER = "omni_text_checkpoint.json"  # how the directory was made (seed, std, device, sizes)
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def text_config(layers: int = 8, scaled: bool = False) -> dict[str, Any]:
    """The thinker's text config (Qwen3-Omni `text_config` keys) at `layers` decoder layers:
    the full preset's widths, or the scaled test preset's."""
    from omni.models.qwen3_omni.checkpoint.presets_full import full_config, scaled_config

    cfg = (scaled_config() if scaled else full_config())["thinker_config"]["text_config"]
    return {**cfg, "num_hidden_layers": int(layers)}


def _section(head_dim: int) -> list[int]:
    """An M-RoPE section for `head_dim` (any split gives 1-D rope on text-only positions):
    [24, 20, 20] at head_dim 128, as the published thinker."""
    half = head_dim // 2
    side = half * 5 // 16
    return [half - 2 * side, side, side]


def thinker_config_from_qwen3_moe(raw: dict[str, Any]) -> ThinkerConfig:
    """omni's thinker config for a Qwen3-MoE `config.json` (text only: no encoders are used)."""
    if raw.get("model_type") not in (None, "qwen3_moe"):
        raise CheckpointError(f"model_type {raw.get('model_type')!r} is not qwen3_moe")
    text = {k: v for k, v in raw.items() if k not in ("architectures", "model_type", "torch_dtype", "rope_scaling")}
    theta = float(raw.get("rope_theta", 1_000_000.0))
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": theta, "mrope_section": _section(raw["head_dim"]),
                               "interleaved": True, "mrope_interleaved": True}
    text.setdefault("intermediate_size", raw.get("moe_intermediate_size"))
    return _thinker({"text_config": text})


def _meta_thinker(cfg: ThinkerConfig, dtype: torch.dtype):
    from omni.layers.random_init import meta
    from omni.models.qwen3_omni.modules.thinker import Qwen3OmniThinker

    with meta(dtype):
        return Qwen3OmniThinker(cfg, dtype)


def fp8_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A shard's decoder linears as e4m3 + `weight_scale_inv` (the published FP8 layout)."""
    from omni.layers.fp8 import SCALE_SUFFIX, quantize_blocks, runs_fp8_linear

    out = {}
    for name, t in state.items():
        if runs_fp8_linear(name):
            out[name], out[name + SCALE_SUFFIX] = quantize_blocks(t)
        else:
            out[name] = t
    return out


def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


@torch.no_grad()
def write_text_checkpoint(out_dir: str | Path, layers: int = 8, seed: int = 0, std: float = DEFAULT_STD,
                          device: str | None = None, scaled: bool = False, text: dict[str, Any] | None = None,
                          log=None, fp8: bool = False) -> Path:
    """Write the reduced-depth, full-width thinker text model as a Qwen3-MoE checkpoint; return its dir.
    `fp8`: the same draws written in the published fine-grained FP8 format (decoder linears e4m3 with
    128x128 `weight_scale_inv`, a `quantization_config`), which SGLang and omni both load."""
    from safetensors.torch import save_file

    from omni.layers.tokenizer_offline_full import SPECIAL_IDS, build_tokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    im_end = SPECIAL_IDS["<|im_end|>"]
    moe_raw = qwen3_moe_config(_thinker({"text_config": text or text_config(layers, scaled)}).text, im_end)
    cfg = thinker_config_from_qwen3_moe(moe_raw)
    names = {n: tuple(t.shape) for n, t in _meta_thinker(cfg, torch.bfloat16).state_dict().items()}
    shards: dict[str, list[str]] = {}
    for name in sorted(names):
        m = _LAYER.match(name)
        shards.setdefault(f"layer{int(m.group(1)):03d}" if m else "rest", []).append(name)
    gen = torch.Generator(device=device).manual_seed(int(seed))
    keys = sorted(shards, key=lambda k: (k == "rest", k))
    total = len(keys)
    weight_map: dict[str, str] = {}
    nbytes = 0
    for i, key in enumerate(keys):
        state = {}
        for name in shards[key]:  # sorted: one fixed draw order per seed
            shape = names[name]
            if _is_norm(name):
                t = torch.ones(shape, dtype=torch.bfloat16)
            else:
                t = torch.empty(shape, dtype=torch.bfloat16, device=device).normal_(0.0, std, generator=gen).cpu()
            state[name] = t
        state = per_expert_names(state, cfg.text)
        if fp8:
            state = fp8_tensors(state)
        fname = f"model-{i + 1:05d}-of-{total:05d}.safetensors"
        save_file(state, str(out / fname), metadata={"format": "pt"})
        for name, t in state.items():
            weight_map[name] = fname
            nbytes += t.numel() * t.element_size()
        del state
        if log:
            log(f"text checkpoint: shard {i + 1}/{total} ({key}) written, {time.perf_counter() - t0:.1f}s")
    (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": nbytes}, "weight_map": weight_map}, indent=1))
    if fp8:
        from omni.models.qwen3_omni.checkpoint.fp8_checkpoint import FORMAT

        moe_raw = {**moe_raw, "quantization_config": FORMAT.to_config()}
    (out / "config.json").write_text(json.dumps(moe_raw, indent=2) + "\n")
    build_tokenizer().save_pretrained(str(out))
    params = sum(torch.Size(s).numel() for s in names.values())
    marker = {"writer": "omni.models.qwen3_omni.checkpoint.text_checkpoint", "seed": int(seed), "std": std, "device": device,
              "layers": cfg.text.num_layers, "hidden_size": cfg.text.hidden_size, "num_experts": cfg.text.num_experts,
              "params": params, "bytes": nbytes, "fp8": fp8, "seconds": round(time.perf_counter() - t0, 1)}
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return out


@torch.no_grad()
def load_text_thinker(text_dir: str | Path, device: str = "cpu", dtype: torch.dtype = torch.bfloat16):
    """`Qwen3OmniThinker` (what omni's AR engine runs for the thinker) with the weights of a Qwen3-MoE
    checkpoint directory: the same tensors SGLang loads from it. Built on the meta device, the
    tensors read straight onto `device` (no second copy of the model in host memory)."""
    from omni.layers.random_init import check_materialized
    from omni.models.qwen3_omni.modules.thinker_layers import text_state_dict

    from omni.layers.fp8 import device_runs_fp8, resolve_state
    from omni.layers.fp8_format import checkpoint_format
    from omni.layers.fp8_modules import convert_shells_

    text_dir = Path(text_dir)
    raw = json.loads((text_dir / "config.json").read_text())
    cfg = thinker_config_from_qwen3_moe(raw)
    model = _meta_thinker(cfg, dtype)
    state = resolve_state(load_state_dict(text_dir, "", device=device, dtype=dtype, fp8=True),
                          checkpoint_format(raw, str(text_dir)), dtype, device_runs_fp8(device), where=str(text_dir))
    state = text_state_dict(state, cfg.text)
    convert_shells_(model, state)  # FP8 pairs kept (on a GPU with FP8 kernels): e4m3 linears and experts
    if "lm_head.weight" not in state and raw.get("tie_word_embeddings"):
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    want = model.state_dict()
    missing, extra = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or extra:
        raise CheckpointError(f"{text_dir}: missing {missing[:6]}, unexpected {extra[:6]}")
    for name, t in state.items():
        if tuple(t.shape) != tuple(want[name].shape):
            raise CheckpointError(f"{text_dir}: {name} has shape {tuple(t.shape)}, expected {tuple(want[name].shape)}")
    model.load_state_dict(state, strict=True, assign=True)
    model.inv_freq = rope_inv_freq(cfg.text.head_dim, cfg.text.rope_theta).to(device)
    model.requires_grad_(False)
    check_materialized(model)
    return model.eval()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="write a reduced-depth, full-width Qwen3-Omni thinker text model "
                                             "(Qwen3-MoE layout, seeded random bf16 weights)")
    ap.add_argument("out_dir")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--std", type=float, default=DEFAULT_STD)
    ap.add_argument("--device", default=None, help="where the weights are drawn (default cuda when present)")
    ap.add_argument("--scaled", action="store_true", help="test widths instead of the published ones")
    ap.add_argument("--fp8", action="store_true", help="decoder linears in fine-grained FP8 (e4m3, 128x128 block scales)")
    args = ap.parse_args(argv)
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    path = write_text_checkpoint(args.out_dir, args.layers, args.seed, args.std, args.device, args.scaled, log=say,
                                 fp8=args.fp8)
    say(f"{path}: {json.loads((path / MARKER).read_text())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
