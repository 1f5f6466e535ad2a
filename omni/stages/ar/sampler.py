"""Per-request sampling of the next token from a batch of logits.

Processing order matches transformers' logits processors: repetition penalty (over prompt
and output tokens, or output only), suppressed tokens, then greedy argmax at temperature 0,
else temperature, top-k, top-p and one multinomial draw. Filters run batched over the rows
with per-row parameters; a request with a seed draws from its own `torch.Generator`, so its
samples do not depend on what else is in the batch.
"""

from __future__ import annotations

import torch

from omni.stages.ar.sequence import Sequence


def apply_repetition_penalty(logits: torch.Tensor, token_ids: list[int], penalty: float) -> torch.Tensor:
    """Divide positive / multiply negative logits of seen tokens by `penalty` (in place, one row)."""
    vocab = logits.shape[-1]
    ids = torch.tensor(sorted({t for t in token_ids if 0 <= t < vocab}), dtype=torch.long, device=logits.device)
    if ids.numel():
        seen = logits[ids]
        logits[ids] = torch.where(seen < 0, seen * penalty, seen / penalty)
    return logits


def top_k_filter(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[N, V] logits, [N] k (0 = off): keep each row's k largest (and ties)."""
    vocab = logits.shape[-1]
    k = torch.where((k <= 0) | (k > vocab), torch.full_like(k, vocab), k)
    kth = torch.sort(logits, dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """[N, V] logits, [N] p: keep the smallest set reaching probability p (at least one)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
    cumulative = sorted_logits.softmax(-1).cumsum(-1)
    remove = cumulative <= (1.0 - p[:, None])
    remove[:, -1] = False
    return logits.masked_fill(remove.scatter(1, order, remove), float("-inf"))


class Sampler:
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """logits [N, V] for `seqs` (same order) -> one token id each."""
        params = [s.params for s in seqs]
        if all(p.greedy and p.repetition_penalty == 1.0 and not p.suppress_token_ids for p in params):
            return logits.argmax(-1).tolist()
        logits = logits.float().clone()
        for i, (seq, p) in enumerate(zip(seqs, params)):
            if p.repetition_penalty != 1.0:
                seen = seq.all_token_ids() if p.penalty_includes_prompt else seq.output_token_ids
                apply_repetition_penalty(logits[i], seen, p.repetition_penalty)
            if p.suppress_token_ids:
                ids = [t for t in p.suppress_token_ids if 0 <= t < logits.shape[-1]]
                logits[i, torch.tensor(ids, dtype=torch.long, device=logits.device)] = float("-inf")
        out = logits.argmax(-1)
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if rows:
            out[rows] = self._draw(logits[rows], [seqs[i] for i in rows])
        return out.tolist()

    def _draw(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        dev = logits.device
        temperature = torch.tensor([s.params.temperature for s in seqs], device=dev)
        logits = logits / temperature[:, None]
        top_k = torch.tensor([s.params.top_k for s in seqs], device=dev)
        if bool((top_k > 0).any()):
            logits = top_k_filter(logits, top_k)
        top_p = torch.tensor([s.params.top_p for s in seqs], device=dev)
        if bool((top_p < 1.0).any()):
            logits = top_p_filter(logits, top_p)
        probs = logits.softmax(-1)
        out = torch.empty(len(seqs), dtype=torch.long, device=dev)
        shared = [i for i, s in enumerate(seqs) if s.params.seed is None]
        if shared:
            out[shared] = torch.multinomial(probs[shared], 1).flatten()
        for i, seq in enumerate(seqs):
            if seq.params.seed is None:
                continue
            if seq.generator is None:
                seq.generator = torch.Generator(device=dev).manual_seed(int(seq.params.seed))
            out[i] = torch.multinomial(probs[i], 1, generator=seq.generator)[0]
        return out
