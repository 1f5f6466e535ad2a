"""Lookahead decode: step N+1 is launched before step N's sampled ids reach the host.

A decode step ends with one copy of its ids (and the talker's codes) to the host; the host then
post-processes, emits, schedules and prepares the next step while the GPU waits for it. At 64
streams that host half was as long as the GPU half. For a model whose next inputs are on the
device (`ARModel.lookahead_decode`: the talkers' frame embeddings, or a thinker's sampled ids,
which the engine copies into the next step's input ids on the device), the engine launches step
N+1 for the same sequences first, then waits for step N and post-processes it while N+1 runs.

Step N+1 is planned as if every sequence of step N goes on: each gets a placeholder output token
(its real id is written over it when step N's ids arrive) and the KV slot of the next position.
A sequence that step N ends (a stop id) has its row of N+1 dropped: the slot it wrote belongs to
blocks freed with it, and every later use of those blocks is queued after N+1 on the same stream.
Only steady decoding looks ahead: an admission, a prefill chunk, another sequence ready to join,
a request for log-probs, or a length limit at N makes the engine take the
ordinary path (sync, then schedule). No torch here.
"""

from __future__ import annotations

from omni.stages.ar.scheduler import ScheduledSeq, Scheduler

PLACEHOLDER = 0  # the output id a sequence holds for step N's token until it arrives (a valid id)


def model_looks_ahead(cls: type) -> bool:
    """`cls.lookahead_decode`, as declared by the class that also defines the hooks a decode step's
    inputs come from: a subclass that changes `input_embeds` or `after_sample` (e.g. embeds the
    host's ids) says so again, or it is not looked ahead of."""
    owner = next((c for c in cls.__mro__ if "lookahead_decode" in vars(c)), None)
    if owner is None or not owner.lookahead_decode:
        return False
    return all(getattr(cls, hook) is getattr(owner, hook) for hook in ("input_embeds", "after_sample"))


def plan_lookahead(scheduler: Scheduler, model, seqs: list, max_model_len: int) -> list[ScheduledSeq] | None:
    """Step N+1 for `seqs` (step N's decoding sequences, all sampling, their results not yet
    applied), or None where it is not a plain continuation. On success each sequence holds a
    placeholder token, its position N is counted as computed and its next slot is allocated."""
    if not seqs or not scheduler.decodes_only(seqs):
        return None
    blocks = scheduler.blocks
    for seq in seqs:
        p = seq.params
        if p.logprobs is not None:
            return None
        if len(seq.output_token_ids) + 1 >= p.max_tokens or seq.num_tokens + 1 > max_model_len:
            return None  # step N may end it by length: no guess needed
    if sum(blocks.blocks_needed(seq, seq.num_tokens + 1) for seq in seqs) > blocks.num_free_blocks:
        return None
    for seq in seqs:
        seq.output_token_ids.append(PLACEHOLDER)
    if not all(model.input_ready(seq) for seq in seqs):  # e.g. the thinker's next text row is not here yet
        for seq in seqs:
            seq.output_token_ids.pop()
        return None
    for seq in seqs:
        seq.num_computed_tokens = seq.num_tokens - 1  # step N's position (its _advance repeats this)
        blocks.allocate(seq, seq.num_tokens)
    return [ScheduledSeq(seq, 1) for seq in seqs]
