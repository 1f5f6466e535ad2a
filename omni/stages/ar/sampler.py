"""Per-request sampling of the next token from a batch of logits.

Processing order matches transformers' logits processors: repetition penalty (over prompt
and output tokens), suppressed tokens, then greedy argmax at temperature 0, else
temperature, top-k, top-p and one multinomial draw. A request with a seed draws from its
own `torch.Generator`, so its samples do not depend on what else is in the batch.
"""

from __future__ import annotations

import torch

from omni.stages.ar.sequence import Sequence


def apply_repetition_penalty(logits: torch.Tensor, token_ids: list[int], penalty: float) -> torch.Tensor:
    """Divide positive / multiply negative logits of seen tokens by `penalty` (in place)."""
    vocab = logits.shape[-1]
    ids = torch.tensor(sorted({t for t in token_ids if 0 <= t < vocab}), dtype=torch.long, device=logits.device)
    if ids.numel():
        seen = logits[ids]
        logits[ids] = torch.where(seen < 0, seen * penalty, seen / penalty)
    return logits


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    if 0 < k < logits.shape[-1]:
        kth = torch.topk(logits, k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches `p` (at least one)."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=False)
    cumulative = sorted_logits.softmax(-1).cumsum(-1)
    remove = cumulative <= (1.0 - p)
    remove[-1] = False
    return logits.masked_fill(remove.scatter(0, order, remove), float("-inf"))


class Sampler:
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """logits [N, V] for `seqs` (same order) -> one token id each."""
        if all(s.params.greedy and s.params.repetition_penalty == 1.0 and not s.params.suppress_token_ids for s in seqs):
            return logits.argmax(-1).tolist()
        return [self._sample_one(logits[i].float().clone(), seq) for i, seq in enumerate(seqs)]

    def _sample_one(self, logits: torch.Tensor, seq: Sequence) -> int:
        p = seq.params
        if p.repetition_penalty != 1.0:
            seen = seq.all_token_ids() if p.penalty_includes_prompt else seq.output_token_ids
            apply_repetition_penalty(logits, seen, p.repetition_penalty)
        if p.suppress_token_ids:
            ids = torch.tensor([t for t in p.suppress_token_ids if 0 <= t < logits.shape[-1]], dtype=torch.long)
            logits[ids.to(logits.device)] = float("-inf")
        if p.greedy:
            return int(logits.argmax())
        logits = logits / p.temperature
        logits = top_p_filter(top_k_filter(logits, p.top_k), p.top_p)
        probs = logits.softmax(-1)
        if p.seed is not None and seq.generator is None:
            seq.generator = torch.Generator(device=logits.device).manual_seed(int(p.seed))
        return int(torch.multinomial(probs, 1, generator=seq.generator))
