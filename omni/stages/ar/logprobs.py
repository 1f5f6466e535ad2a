"""Per-token log-probabilities for requests that ask for them (OpenAI's `logprobs` / `top_logprobs`).

Kept apart from the sampler: it reads the logits the model gave (before any sampling filter, as
vLLM's default `raw_logprobs` does) and the ids the sampler chose, for the rows that asked, in one
batched log_softmax. `describe` turns ids into OpenAI's entries with a tokenizer.
"""

from __future__ import annotations

from typing import Any

import torch

Entry = tuple[int, float, list[tuple[int, float]]]  # (chosen id, its log-prob, [(id, log-prob)] most likely first)


def gather_logprobs(logits: torch.Tensor, token_ids: list[int], tops: list[int | None]) -> list[Entry | None]:
    """logits [N, V] and the N chosen ids; `tops[i]` is how many alternatives row i wants (None:
    it asked for no log-probs)."""
    rows = [i for i, k in enumerate(tops) if k is not None]
    out: list[Entry | None] = [None] * len(tops)
    if not rows:
        return out
    index = torch.tensor(rows, device=logits.device)
    logprobs = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
    chosen = torch.tensor([token_ids[i] for i in rows], device=logits.device)
    picked = logprobs.gather(1, chosen[:, None])[:, 0].tolist()
    k = max(tops[i] for i in rows)
    top_values, top_ids = (logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], logprobs[:, :0].long()))
    top_values, top_ids = top_values.tolist(), top_ids.tolist()
    for j, i in enumerate(rows):
        n = tops[i]
        out[i] = (token_ids[i], picked[j], list(zip(top_ids[j][:n], top_values[j][:n])))
    return out


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet back to bytes (the inverse of `bytes_to_unicode`)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, codes)}


_BYTES = _byte_decoder()


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """The bytes a token stands for (a byte-level token may hold part of a UTF-8 character)."""
    piece = tokenizer.id_to_token(token_id) or ""
    if piece and all(ch in _BYTES for ch in piece):
        return bytes(_BYTES[ch] for ch in piece)
    return tokenizer.decode([token_id], skip_special_tokens=False).encode()


def describe(tokenizer: Any, entries: list[Entry]) -> list[dict[str, Any]]:
    """OpenAI's `logprobs.content` items: {"token", "bytes", "logprob", "top_logprobs": [...]}."""
    def one(token_id: int, logprob: float) -> dict[str, Any]:
        raw = token_bytes(tokenizer, token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "bytes": list(raw), "logprob": logprob}

    return [{**one(t, lp), "top_logprobs": [one(a, alp) for a, alp in top]} for t, lp, top in entries]
