"""Word timestamps (`timestamp_granularities[]=word`): tokens aligned to audio frames, as transformers does.

One plain forward of the decoder over a pass's prompt and tokens records the cross-attention
probabilities of the checkpoint's alignment heads (`generation_config.alignment_heads`). As in
transformers' `_extract_token_timestamps`: keep the frames of real audio, drop the prompt's rows,
normalise each head over the tokens, median-filter along time (width 7), average the heads, and
run dynamic time warping on the negated matrix; a token's time is where its row first appears on
the path (0.02 s per encoder frame). A word starts at its first token's time and ends where the
next word starts (the last word: at the last token's time).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from omni.layers.attention import sdpa

SECONDS_PER_FRAME = 0.02  # one encoder output frame
MEDIAN_WIDTH = 7


def alignment_heads(model_dir) -> list[tuple[int, int]]:
    """(layer, head) pairs of the checkpoint's generation_config.json; [] when it names none."""
    import json
    from pathlib import Path

    path = Path(model_dir) / "generation_config.json"
    heads = json.loads(path.read_text()).get("alignment_heads") if path.is_file() else None
    return [(int(layer), int(head)) for layer, head in heads or ()]


@torch.inference_mode()
def alignment_weights(net, memory: torch.Tensor, ids: list[int], heads: list[tuple[int, int]]) -> torch.Tensor:
    """[len(heads), len(ids), S] cross-attention probabilities of `ids` (prompt + tokens) over
    `memory` [S, d] (the pass's encoder output); `net` is the decoder's `TextDecoder`."""
    dtype = net.embed_tokens.weight.dtype
    idx = torch.tensor(ids, device=memory.device)
    x = net.embed_tokens(idx) + net.embed_positions.weight[: len(ids)]
    memory = memory.to(dtype)
    wanted: dict[int, list[int]] = {}
    for layer, head in heads:
        wanted.setdefault(layer, []).append(head)
    found: dict[tuple[int, int], torch.Tensor] = {}
    for i, layer in enumerate(net.layers):
        attn = layer.self_attn
        h = layer.self_attn_layer_norm(x)
        q, k, v = (attn.split(p(h)).transpose(0, 1) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        x = x + attn.out_proj(sdpa(q, k, v, is_causal=True).transpose(0, 1).flatten(1))
        cross = layer.encoder_attn
        q = cross.split(cross.q_proj(layer.encoder_attn_layer_norm(x))).transpose(0, 1)  # [H, T, hd]
        k, v = cross.keys_values(memory)
        probs = torch.softmax((q.float() @ k.float().transpose(1, 2)) * cross.head_dim ** -0.5, dim=-1)
        for head in wanted.get(i, ()):
            found[(i, head)] = probs[head]
        if i >= max(wanted):
            break
        x = x + cross.out_proj((probs.to(v.dtype) @ v).transpose(0, 1).flatten(1))
        x = x + layer.mlp(x)
    return torch.stack([found[(layer, head)] for layer, head in heads])


def median_filter(x: torch.Tensor, width: int = MEDIAN_WIDTH) -> torch.Tensor:
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    x = F.pad(x[None], (pad, pad, 0, 0), mode="reflect")[0]
    return x.unfold(-1, width, 1).sort()[0][..., pad]


def dtw_path(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The monotonic path through `cost` [T, S] of least total cost: (row, column) indices."""
    rows, cols = cost.shape
    total = np.full((rows + 1, cols + 1), np.inf, dtype=np.float32)
    trace = -np.ones((rows + 1, cols + 1), dtype=np.float32)
    total[0, 0] = 0
    for j in range(1, cols + 1):  # column by column, as transformers does (ties resolve the same way)
        for i in range(1, rows + 1):
            c0, c1, c2 = total[i - 1, j - 1], total[i - 1, j], total[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            total[i, j] = cost[i - 1, j - 1] + c
            trace[i, j] = t
    trace[0, :], trace[:, 0] = 2, 1
    i, j, path_i, path_j = rows, cols, [], []
    while i > 0 or j > 0:
        path_i.append(i - 1)
        path_j.append(j - 1)
        if trace[i, j] == 0:
            i, j = i - 1, j - 1
        elif trace[i, j] == 1:
            i -= 1
        else:
            j -= 1
    return np.array(path_i[::-1]), np.array(path_j[::-1])


def token_times(weights: torch.Tensor, num_prompt: int, num_frames: int) -> list[float]:
    """Seconds into the window of each token after the prompt (`weights` from `alignment_weights`;
    `num_frames`: log-mel frames of real audio in the window)."""
    w = weights[:, num_prompt:, : max(1, num_frames // 2)].float()
    if w.shape[1] == 0:
        return []
    w = (w - w.mean(dim=-2, keepdim=True)) / w.std(dim=-2, keepdim=True, unbiased=False)
    matrix = median_filter(w).mean(dim=0)
    rows, cols = dtw_path(-matrix.double().cpu().numpy())
    jumps = np.pad(np.diff(rows), (1, 0), constant_values=1).astype(bool)
    return [float(t) * SECONDS_PER_FRAME for t in cols[jumps]]


def words(pieces: list[str], times: list[float], offset_s: float) -> list[dict]:
    """Words from text tokens (`pieces`: each token's text, `times`: its time): a word begins at a
    token that begins with a space (punctuation stays with the word before it)."""
    out: list[dict] = []
    for piece, t in zip(pieces, times):
        starts = not out or (piece[:1].isspace() and piece.strip() != "")
        if starts:
            if out:
                out[-1]["end"] = round(offset_s + t, 3)
            out.append({"word": piece.strip(), "start": round(offset_s + t, 3), "end": round(offset_s + t, 3)})
        else:
            out[-1]["word"] += piece.strip() if not piece[:1].isspace() else ""
    if out and times:
        out[-1]["end"] = round(offset_s + max(times[-1], out[-1]["start"] - offset_s), 3)
    return [w for w in out if w["word"]]
