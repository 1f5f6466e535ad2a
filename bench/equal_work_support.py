"""Shared by the equal-work drivers (bench/omni_engine_load.py, bench/sglang_engine_load.py) and
bench/expert_hits.py: the distinct prompts, the token-stream record each engine writes, and the
"experts hit per layer per decode step" measure.

Prompts: request i gets `prompt_len` token ids drawn uniformly from [0, 151643) (below every special
id) by a generator seeded with (seed, i): every request differs, and both engines get the same
prompt for the same index.

Token record (JSON, one per engine run): {"engine", "seed", "prompt_len", "max_tokens", "levels":
[{"phase", "concurrency", "requests": [{"index", "output_ids", "t_submit", "t_tokens"}]}]}, times in
seconds from the level's start, `t_tokens[j]` when output token j reached the client.

Experts hit per decode step: replaying each request's tokens (prompt + output) through the router
weights gives, for every decode input token, the top-k experts of every layer (expert_hits.py).
Which requests shared a decode step is read off the token times: at an instant tau inside a level,
every request that has its first output token and not yet its last is in the running batch, and
its step at tau processes its latest output token. The union of those tokens' experts at a layer is
what that step reads of that layer's experts. The measure samples `samples` instants evenly over
each level and averages (per layer and over layers); it is the same for both engines, whatever
their schedulers do. `uniform_hits(B)` = E(1 - (1 - k/E)^B) is what B tokens routed uniformly at
random would hit.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np

SPECIAL_FLOOR = 151643  # the first special id of the Qwen3 vocabulary


def distinct_prompt(index: int, length: int, seed: int = 0, vocab: int = SPECIAL_FLOOR) -> list[int]:
    rng = np.random.default_rng([int(seed), int(index)])
    return rng.integers(0, min(vocab, SPECIAL_FLOOR), size=int(length)).tolist()


def uniform_hits(batch: float, num_experts: int, top_k: int) -> float:
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** batch)


def co_running(level: dict[str, Any], samples: int = 64) -> list[list[tuple[int, int]]]:
    """For `samples` instants evenly inside the level's decode time: the (request index, decode input
    position in its output) of every request decoding then. Position j means the step feeds output
    token j (so it makes token j + 1); requests with one output token never decode."""
    reqs = [r for r in level["requests"] if len(r.get("t_tokens") or ()) >= 2]
    if not reqs:
        return []
    lo = min(r["t_tokens"][0] for r in reqs)
    hi = max(r["t_tokens"][-1] for r in reqs)
    if hi <= lo:
        return []
    out = []
    for s in range(samples):
        tau = lo + (hi - lo) * (s + 0.5) / samples
        batch = []
        for r in reqs:
            times = r["t_tokens"]
            if times[0] <= tau < times[-1]:
                emitted = bisect_right(times, tau)  # output tokens that exist at tau (>= 1)
                batch.append((r["index"], emitted - 1))
        if batch:
            out.append(batch)
    return out


def hits_per_step(level: dict[str, Any], topk: dict[int, np.ndarray], prompt_len: int, num_experts: int,
                  samples: int = 64) -> dict[str, Any] | None:
    """Experts hit per layer per decode step for one level. `topk[index]` is [positions, layers, k]: the
    router's choices at every position of request `index`'s prompt + output (from the replay)."""
    steps = co_running(level, samples)
    per_step = []  # [samples, layers]
    sizes = []
    for batch in steps:
        rows = [topk[i][prompt_len + j] for i, j in batch if i in topk and prompt_len + j < len(topk[i])]
        if not rows:
            continue
        chosen = np.stack(rows)  # [B, L, k]
        per_step.append([len(np.unique(chosen[:, layer, :])) for layer in range(chosen.shape[1])])
        sizes.append(len(rows))
    if not per_step:
        return None
    arr = np.asarray(per_step, dtype=np.float64)
    top_k = next(iter(topk.values())).shape[-1]
    return {"steps_sampled": len(per_step), "batch_mean": round(float(np.mean(sizes)), 2),
            "hits_per_layer_mean": round(float(arr.mean()), 2),
            "hits_per_layer_min_layer": round(float(arr.mean(0).min()), 2),
            "hits_per_layer_max_layer": round(float(arr.mean(0).max()), 2),
            "hits_by_layer": [round(float(x), 2) for x in arr.mean(0)],
            "uniform_expectation": round(float(np.mean([uniform_hits(b, num_experts, top_k) for b in sizes])), 2)}


def stream_stats(level: dict[str, Any]) -> dict[str, Any]:
    """How varied the token streams are: distinct output streams, and distinct tokens per output
    position (1 everywhere would be identical streams: the degenerate case that hits few experts)."""
    outs = [tuple(r["output_ids"]) for r in level["requests"] if r.get("output_ids")]
    if not outs:
        return {"requests": 0}
    n = min(len(o) for o in outs)
    per_pos = [len({o[j] for o in outs}) for j in range(n)]
    return {"requests": len(outs), "distinct_streams": len(set(outs)),
            "distinct_tokens_per_position_mean": round(float(np.mean(per_pos)), 2) if per_pos else None,
            "distinct_tokens_overall": len({t for o in outs for t in o})}


def agreement(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """Two engines' records on the same prompts (greedy, same weights): per request index, the share of
    output tokens before the first difference (bf16 near-ties flip a token now and then)."""
    def by_index(rec):
        return {r["index"]: r["output_ids"] for lv in rec.get("levels", []) if lv.get("phase") == "warm"
                for r in lv["requests"] if r.get("output_ids")}

    x, y = by_index(a), by_index(b)
    common = sorted(set(x) & set(y))
    if not common:
        return None
    fracs, equal = [], 0
    for i in common:
        p, q = x[i], y[i]
        n = min(len(p), len(q))
        first = next((j for j in range(n) if p[j] != q[j]), n)
        fracs.append(first / max(n, 1))
        equal += p == q
    return {"requests": len(common), "identical": equal, "prefix_share_mean": round(float(np.mean(fracs)), 4)}
