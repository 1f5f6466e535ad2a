"""The bytes a thinker decode step must read, set against what a profile measured (used by
bench/profile_decode.py), and the markdown of its report.

Bytes per step at batch B (bf16): every non-expert weight once (attention, norms, routers,
lm_head), the experts the batch touches (expected distinct experts per MoE layer when each of
B tokens picks top_k of E uniformly: E * (1 - (1 - k/E)^B); random weights route about
uniformly), and the KV cache of B sequences of `ctx` tokens. Ideal time = bytes / HBM bandwidth.
"""

from __future__ import annotations

from typing import Any

from omni.models.qwen3_omni.checkpoint.presets_full import thinker_active_bytes

BYTES = 2  # bf16


def roofline(cfg, batch: int, ctx: int, summary: dict, tpot_ms: float, hbm_tbps: float) -> dict[str, Any]:
    t = cfg.text
    moe_layers = sum(1 for i in range(t.num_layers) if t.is_moe_layer(i))
    expert = 3 * t.hidden_size * t.moe_intermediate_size * BYTES
    base = thinker_active_bytes(cfg) - moe_layers * t.num_experts_per_tok * expert
    touched = t.num_experts * (1 - (1 - t.num_experts_per_tok / t.num_experts) ** batch)
    experts = moe_layers * touched * expert
    kv = batch * ctx * t.num_layers * 2 * t.num_kv_heads * t.head_dim * BYTES
    proj = t.num_layers * t.hidden_size * t.head_dim * (2 * t.num_heads + 2 * t.num_kv_heads) * BYTES
    lm_head = t.vocab_size * t.hidden_size * BYTES
    total = base + experts + kv
    bw = hbm_tbps * 1e12
    cats = summary.get("categories_us_per_step", {})

    def tbps(nbytes: float, us: float | None) -> float | None:
        return round(nbytes / (us * 1e-6) / 1e12, 3) if us else None

    return {
        "bytes_per_step": int(total),
        "expert_bytes": int(experts), "experts_touched_per_layer": round(touched, 1),
        "non_expert_weight_bytes": int(base), "kv_bytes": int(kv),
        "ideal_us": round(total / bw * 1e6, 1),
        "of_roofline_wall": round(total / bw * 1e6 / (1000 * tpot_ms), 4) if tpot_ms else None,
        "tbps_over_wall": tbps(total, 1000 * tpot_ms),
        "tbps_over_device_busy": tbps(total, summary.get("device_busy_us_per_step")),
        "moe_gemm_tbps": tbps(experts, cats.get("MoE GEMMs")),
        "dense_proj_tbps": tbps(proj, cats.get("dense GEMMs (q/k/v/o proj)")),
        "lm_head_tbps": tbps(lm_head, cats.get("lm_head")),
    }


def _rows(report: dict) -> list[tuple[str, dict]]:
    return [(b.get("backend", "?"), r) for b in report["backends"] for r in b.get("rows", [])]


def markdown(report: dict) -> str:
    out = [f"## Thinker decode profile ({report['date']})", "", f"Command: `{report['command']}`  ",
           f"MoE backend variable supported: {report['backend_env_supported']}; total {report['seconds']} s", ""]
    for b in report["backends"]:
        if "skipped" in b or "rows" not in b:
            out.append(f"- backend {b.get('backend')}: not run ({b.get('skipped') or 'rc ' + str(b.get('returncode'))})")
    out += ["", "| backend | batch | TPOT ms | profiled wall us/step | GPU busy us | host-only us | busy | kernels/step "
                "| ideal us | of roofline | TB/s (wall) |", "|" + "---|" * 11]
    for name, r in _rows(report):
        if "error" in r:
            out.append(f"| {name} | {r['batch']} | error: {r['error'][:150]} |" + " |" * 8)
            continue
        rf = r["roofline"]
        out.append(f"| {name} | {r['batch']} | {r['tpot_ms']} | {r['wall_us_per_step']} | {r['device_busy_us_per_step']} "
                   f"| {r['host_only_us_per_step']} | {r['device_busy_fraction']} | {r['kernels_per_step']} "
                   f"| {rf['ideal_us']} | {rf['of_roofline_wall']} | {rf['tbps_over_wall']} |")
    ok = [(n, r) for n, r in _rows(report) if "error" not in r]
    if ok:
        groups = list(ok[0][1]["groups_us_per_step"])
        out += ["", "GPU time per step by category (us):", "",
                "| backend | batch | " + " | ".join(groups) + " |", "|" + "---|" * (len(groups) + 2)]
        for n, r in ok:
            out.append(f"| {n} | {r['batch']} | " + " | ".join(str(r["groups_us_per_step"][g]) for g in groups) + " |")
        out += ["", "Achieved bandwidth (TB/s) of the parts that should be bandwidth-bound:", "",
                "| backend | batch | experts touched/layer | MoE GEMMs | q/k/v/o proj | lm_head | all bytes / GPU busy |",
                "|---|---|---|---|---|---|---|"]
        for n, r in ok:
            rf = r["roofline"]
            out.append(f"| {n} | {r['batch']} | {rf['experts_touched_per_layer']} | {rf['moe_gemm_tbps']} "
                       f"| {rf['dense_proj_tbps']} | {rf['lm_head_tbps']} | {rf['tbps_over_device_busy']} |")
    for n, r in ok:
        out += ["", f"Top kernels, backend {n}, batch {r['batch']} (trace: `{r['trace']}`):", "",
                "| kernel | us/step | count/step | share | category |", "|---|---|---|---|---|"]
        for k in r["top_kernels"]:
            out.append(f"| `{k['name'][:90]}` | {k['us_per_step']} | {k['count_per_step']} | {k['share']} | {k['category']} |")
    out += ["", "How to read it: GPU busy = union of kernel/memcpy time in a step; host-only = wall - busy (Python, "
                "batch build, sampling, launch gaps). Ideal = bytes a step must read (non-expert weights once, the experts "
                "the batch touches, the KV cache) / HBM bandwidth; 'of roofline' = ideal / TPOT. A category's TB/s far "
                "below the HBM peak means its kernels are latency- or launch-bound, not bandwidth-bound."]
    return "\n".join(out) + "\n"
