"""The one sampler of every AR stage and of the code predictor: batched, on the device, graph-safe.

Per row, in transformers' order: penalties (repetition over the tokens a row has seen,
presence and frequency over its output, as vLLM defines them), additive bias (suppressed ids
are -inf), the model's logits processors, then greedy argmax at temperature 0, else
temperature, top-k, top-p, min-p and one draw. Every parameter is a per-row tensor; nothing in
`Sampler.sample` reads a Python value of a row or syncs with the host, so a decode step's CUDA
graph records it whole.

Draws are an exponential race (argmax of p_i / E_i, E_i ~ Exp(1)) whose noise is a counter-based
hash of (row seed, row draw counter, token id): a seeded request gets the same tokens alone or
batched, replayed from a graph or run eagerly, on CPU or GPU. Unseeded requests get a random
seed at admission.

State lives in slots: one row per running sequence (plus a scratch row for padding), holding
its parameters, a device count of its output tokens, a mask of its prompt tokens and its bias
row. A slot is (re)built from the sequence's host state when the sequence is admitted, and
freed when it is preempted, finished or aborted.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence as Seq

import torch

if TYPE_CHECKING:
    from omni.stages.ar.sequence import Sequence

NEG_INF = float("-inf")
_M32 = 0xFFFFFFFF
_M31 = 0x7FFFFFFF
SMALL_VOCAB = 32768  # at or below: every batch takes the full path (its sort is cheap)
MAX_MIN_TOKENS_STOPS = 8  # stop ids a row's min_tokens holds back (the first ones)


class F(enum.IntEnum):
    """The columns of `Sampler.fparams` (a slot's float parameters)."""
    TEMPERATURE, TOP_P, MIN_P, REPETITION, PRESENCE, FREQUENCY = range(6)


class I(enum.IntEnum):  # noqa: E742
    """The columns of `Sampler.iparams` (a slot's integer parameters and its output counter)."""
    TOP_K, SEED, COUNTER, MIN_TOKENS = range(4)


class SampleMode(enum.IntEnum):
    """How much of the pipeline a batch needs (a CUDA-graph key): filters need one sort."""

    GREEDY = 0  # every row greedy: penalties, bias, argmax (eager steps only: graphs use SAMPLE)
    SAMPLE = 1  # penalties, bias, greedy rows, temperature, min-p, draw
    FILTER = 2  # ... and top-k / top-p


@dataclass
class RowParams:
    """Per-row sampling parameters, each [B] on the logits' device."""

    temperature: torch.Tensor  # float32; 0 = greedy
    top_k: torch.Tensor  # int64; 0 = off
    top_p: torch.Tensor  # float32; 1 = off
    min_p: torch.Tensor  # float32; 0 = off
    seed: torch.Tensor  # int64
    counter: torch.Tensor  # int64: the row's draw index (tokens it sampled so far)

    @classmethod
    def constant(cls, batch: int, device, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0) -> "RowParams":
        def full(value, dtype):
            return torch.full((batch,), value, dtype=dtype, device=device)

        return cls(full(temperature, torch.float32), full(top_k, torch.long), full(top_p, torch.float32),
                   full(min_p, torch.float32), full(0, torch.long), full(0, torch.long))


# ---- noise ------------------------------------------------------------------------------
def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32-style) on int64 holding [0, 2^32): exact on every device."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & _M32
    return x ^ (x >> 16)


def uniform_noise(seed: torch.Tensor, counter: torch.Tensor, vocab: torch.Tensor) -> torch.Tensor:
    """[B] seeds, [B] counters, [V] token ids -> [B, V] uniforms in (0, 1), a pure function of the three."""
    row = _mix32((seed & _M31) ^ _mix32((counter & _M31) ^ 0x2545F491))
    x = _mix32((row[:, None] + vocab[None, :] * 0x9E3779B1) & _M32)
    return ((x >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))  # 23 bits + 0.5: exact in float32, never 0 or 1


# ---- the pipeline -----------------------------------------------------------------------
def apply_penalties(logits: torch.Tensor, seen: torch.Tensor, counts: torch.Tensor, repetition: torch.Tensor,
                    presence: torch.Tensor, frequency: torch.Tensor) -> torch.Tensor:
    """[B, V] logits; `seen` [B, V] bool (tokens the repetition penalty covers), `counts` [B, V]
    output counts; per-row [B] penalties (1, 0, 0 = off)."""
    r = repetition[:, None]
    logits = torch.where(seen, torch.where(logits < 0, logits * r, logits / r), logits)
    return logits - frequency[:, None] * counts - presence[:, None] * (counts > 0).to(logits.dtype)


def warp(logits: torch.Tensor, rows: RowParams, mode: SampleMode) -> torch.Tensor:
    """Temperature, then top-k and top-p (FILTER mode), then min-p, as transformers' warpers do,
    except that top-p's cut is a value: ties with the last kept token are kept (transformers cuts
    them by sort position). Greedy rows are divided by 1 (their token is the argmax before warping)."""
    t = torch.where(rows.temperature > 0, rows.temperature, torch.ones_like(rows.temperature))
    x = logits / t[:, None]
    vocab = x.shape[-1]
    if mode >= SampleMode.FILTER:
        k = torch.where((rows.top_k <= 0) | (rows.top_k > vocab), torch.full_like(rows.top_k, vocab), rows.top_k)
        s = torch.sort(x, dim=-1).values  # ascending, as transformers' top-p
        kth = s.gather(1, (vocab - k)[:, None])
        s = s.masked_fill(s < kth, NEG_INF)
        remove = s.softmax(-1).cumsum(-1) <= (1.0 - rows.top_p)[:, None]
        remove[:, -1] = False
        # the smallest value kept, as a threshold: tokens tied with it are all kept, so the result
        # does not hang on the sort's order of equal values (which differs between devices)
        cut = s.masked_fill(remove | (s == NEG_INF), float("inf")).amin(-1, keepdim=True)
        x = x.masked_fill(x < cut, NEG_INF)
    probs = x.softmax(-1)
    floor = rows.min_p[:, None] * probs.amax(-1, keepdim=True)
    return x.masked_fill(probs < floor, NEG_INF)


def draw(logits: torch.Tensor, warped: torch.Tensor, rows: RowParams, vocab_ids: torch.Tensor) -> torch.Tensor:
    """One token per row: argmax of `logits` for greedy rows, else an exponential race over
    softmax(`warped`) with the row's hashed noise."""
    greedy = logits.argmax(-1)
    exponential = -torch.log(uniform_noise(rows.seed, rows.counter, vocab_ids))
    sampled = (warped.softmax(-1) / exponential).argmax(-1)
    return torch.where(rows.temperature > 0, sampled, greedy)


def sample_rows(logits: torch.Tensor, rows: RowParams, mode: SampleMode = SampleMode.FILTER,
                vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Stateless sampling of [B, V] logits with per-row `rows` (the code predictor's path)."""
    logits = logits.float()
    if vocab_ids is None:
        vocab_ids = torch.arange(logits.shape[-1], device=logits.device)
    return draw(logits, warp(logits, rows, mode), rows, vocab_ids)


def nonfinite_rows(logits: torch.Tensor) -> torch.Tensor:
    """[B] bool: rows holding NaN or +inf (a poisoned request: no token can be drawn from them)."""
    return torch.isnan(logits).any(-1) | torch.isposinf(logits).any(-1)


# ---- logits processors ------------------------------------------------------------------
class LogitsProcessor:
    """A model's rule over the logits, run after penalties and bias, before warping.

    `graph_safe` processors are tensor code over `slots` only (they run inside CUDA graphs,
    where `seqs` is None); others get the host sequences and make the engine sample eagerly.
    """

    graph_safe = True

    def __call__(self, logits: torch.Tensor, slots: torch.Tensor, seqs: "list[Sequence] | None") -> torch.Tensor:
        raise NotImplementedError


class SuppressTokens(LogitsProcessor):
    """Ids a model never emits (e.g. the talker's codec specials): -inf on every row."""

    def __init__(self, token_ids: Seq[int], vocab_size: int, device) -> None:
        mask = torch.zeros(vocab_size, dtype=torch.bool)
        ids = [int(t) for t in token_ids if 0 <= int(t) < vocab_size]
        mask[ids] = True
        self.mask = mask.to(device)

    def __call__(self, logits, slots, seqs):
        return logits.masked_fill(self.mask, NEG_INF)


def _mask_early_stops(x: torch.Tensor, stop_ids: torch.Tensor, early: torch.Tensor) -> torch.Tensor:
    """-inf at each row's stop ids while it has fewer than min_tokens outputs (`early`); graph-safe.
    A row's padding repeats its first stop id, so duplicate scatter targets write one value."""
    ids = stop_ids.clamp_min(0)
    mask = early[:, None] & (stop_ids >= 0)
    return x.scatter(1, ids, torch.where(mask, torch.full_like(x[:, :1], NEG_INF), x.gather(1, ids)))


# ---- the stateful sampler of an engine --------------------------------------------------
class Sampler:
    """Slots of per-sequence sampling state and the batched `sample` over them."""

    def __init__(self, vocab_size: int, num_slots: int, device, processors: Seq[LogitsProcessor] = ()) -> None:
        dev = self.device = torch.device(device)
        self.vocab_size, self.num_slots = vocab_size, num_slots
        rows = num_slots + 1  # + the scratch slot of padding rows
        self.scratch_slot = num_slots
        self.processors = list(processors)
        self.vocab_ids = torch.arange(vocab_size, device=dev)
        self.fparams = torch.zeros(rows, len(F), dtype=torch.float32, device=dev)
        self.iparams = torch.zeros(rows, len(I), dtype=torch.long, device=dev)
        # per row its stop ids (padded with its first one; -1: none), masked while counter < min_tokens
        self.stop_ids = torch.full((rows, MAX_MIN_TOKENS_STOPS), -1, dtype=torch.long, device=dev)
        self.fparams[:, F.TOP_P] = 1.0
        self.fparams[:, F.REPETITION] = 1.0
        self.counts = torch.zeros(rows, vocab_size, dtype=torch.float32, device=dev)
        self.prompt_seen = torch.zeros(rows, vocab_size, dtype=torch.bool, device=dev)
        self.bias = torch.zeros(rows, vocab_size, dtype=torch.float32, device=dev)
        self._free = list(range(num_slots - 1, -1, -1))
        self._ids_cache: dict[tuple[int, ...], torch.Tensor] = {}

    @property
    def graph_safe(self) -> bool:
        return all(p.graph_safe for p in self.processors)

    # ---- slots --------------------------------------------------------------------
    def assign(self, seq: "Sequence") -> int:
        """Give `seq` a slot built from its host state (params, prompt, outputs so far)."""
        if seq.sample_slot is not None:
            return seq.sample_slot
        if not self._free:
            raise RuntimeError(f"sampler: all {self.num_slots} slots are taken")
        slot = seq.sample_slot = self._free.pop()
        p = seq.params
        if seq.sample_seed is None:
            seq.sample_seed = int(p.seed) if p.seed is not None else random.getrandbits(31)
        floats = {F.TEMPERATURE: p.temperature, F.TOP_P: p.top_p, F.MIN_P: p.min_p, F.REPETITION: p.repetition_penalty,
                  F.PRESENCE: p.presence_penalty, F.FREQUENCY: p.frequency_penalty}
        ints = {I.TOP_K: p.top_k, I.SEED: seq.sample_seed, I.COUNTER: len(seq.output_token_ids), I.MIN_TOKENS: p.min_tokens}
        self.fparams[slot] = torch.tensor([floats[c] for c in F])
        self.iparams[slot] = torch.tensor([ints[c] for c in I])
        stops = [t for t in p.stop_token_ids if 0 <= t < self.vocab_size][:MAX_MIN_TOKENS_STOPS] if p.min_tokens else []
        self.stop_ids[slot] = torch.tensor((stops + stops[:1] * MAX_MIN_TOKENS_STOPS)[:MAX_MIN_TOKENS_STOPS]
                                           if stops else [-1] * MAX_MIN_TOKENS_STOPS)
        self.counts[slot].zero_()
        if seq.output_token_ids:
            out = self._ids(tuple(seq.output_token_ids))
            self.counts[slot].index_put_((out,), torch.ones_like(out, dtype=torch.float32), accumulate=True)
        self.prompt_seen[slot].zero_()
        if p.repetition_penalty != 1.0 and p.penalty_includes_prompt:
            self.prompt_seen[slot, self._ids(tuple(seq.prompt_token_ids))] = True
        self.bias[slot].zero_()
        for token, value in p.logit_bias:
            if 0 <= token < self.vocab_size:
                self.bias[slot, token] = value
        if p.suppress_token_ids:
            self.bias[slot, self._ids(p.suppress_token_ids)] = NEG_INF
        return slot

    def release(self, seq: "Sequence") -> None:
        if seq.sample_slot is not None:
            self._free.append(seq.sample_slot)
            seq.sample_slot = None

    def _ids(self, ids: tuple[int, ...]) -> torch.Tensor:
        """Valid ids as a device tensor (cached for repeated sets such as suppressed ranges)."""
        cached = self._ids_cache.get(ids)
        if cached is None:
            valid = [t for t in ids if 0 <= t < self.vocab_size]
            cached = torch.tensor(valid, dtype=torch.long).to(self.device)
            if len(ids) > 64:
                self._ids_cache[ids] = cached
        return cached

    def mode_for(self, seqs: "list[Sequence]", graph: bool = False) -> SampleMode:
        """The least of the pipeline these rows need; for a graph key (`graph`) one of the modes
        captured at start-up (a small vocabulary always takes FILTER there: its sort is cheap)."""
        if graph and self.vocab_size <= SMALL_VOCAB:
            return SampleMode.FILTER
        if any(s.params.top_k > 0 or s.params.top_p < 1.0 for s in seqs):
            return SampleMode.FILTER
        if not graph and all(s.params.greedy for s in seqs):
            return SampleMode.GREEDY
        return SampleMode.SAMPLE

    def slots_of(self, seqs: "list[Sequence]") -> torch.Tensor:
        return torch.tensor([s.sample_slot for s in seqs], dtype=torch.long).to(self.device, non_blocking=True)

    # ---- sampling -----------------------------------------------------------------
    def process(self, logits: torch.Tensor, slots: torch.Tensor, mode: SampleMode,
                seqs: "list[Sequence] | None" = None) -> tuple[torch.Tensor, torch.Tensor, RowParams]:
        """The rows' logits after penalties, bias and processors (what greedy rows argmax), after
        warping too (what sampling rows draw from), and their parameters."""
        f, i = self.fparams[slots], self.iparams[slots]
        counts = self.counts[slots]
        seen = self.prompt_seen[slots] | (counts > 0)
        x = apply_penalties(logits.float(), seen, counts, f[:, F.REPETITION], f[:, F.PRESENCE],
                            f[:, F.FREQUENCY]) + self.bias[slots]
        x = _mask_early_stops(x, self.stop_ids[slots], i[:, I.COUNTER] < i[:, I.MIN_TOKENS])
        for processor in self.processors:
            x = processor(x, slots, seqs)
        rows = RowParams(f[:, F.TEMPERATURE], i[:, I.TOP_K], f[:, F.TOP_P], f[:, F.MIN_P], i[:, I.SEED], i[:, I.COUNTER])
        return x, (x if mode == SampleMode.GREEDY else warp(x, rows, mode)), rows

    def sample(self, logits: torch.Tensor, slots: torch.Tensor, mode: SampleMode,
               seqs: "list[Sequence] | None" = None) -> torch.Tensor:
        """[B, V] logits of the rows in `slots` -> [B] token ids (-1 for a row whose logits are
        not finite). Counts each drawn token into its slot. Graph-safe when every processor is."""
        logits = logits.float()
        if mode == SampleMode.GREEDY and seqs is not None and all(s.params.neutral for s in seqs):
            return self._plain_argmax(logits, slots, seqs)  # eager greedy rows with nothing to apply
        x, warped, rows = self.process(logits, slots, mode, seqs)
        tokens = x.argmax(-1) if mode == SampleMode.GREEDY else draw(x, warped, rows, self.vocab_ids)
        tokens = torch.where(nonfinite_rows(logits), torch.full_like(tokens, -1), tokens)
        ones = torch.ones_like(tokens, dtype=torch.float32)
        self.counts.index_put_((slots, tokens.clamp_min(0)), ones, accumulate=True)
        self.iparams[:, I.COUNTER].index_put_((slots,), torch.ones_like(tokens), accumulate=True)
        return tokens

    def _plain_argmax(self, logits: torch.Tensor, slots: torch.Tensor, seqs: "list[Sequence]") -> torch.Tensor:
        """Greedy rows without penalties or bias: the processors, then argmax. Their slots' counts
        are left alone (nothing reads them; a slot is rebuilt from the host state when needed)."""
        x = logits
        for processor in self.processors:
            x = processor(x, slots, seqs)
        tokens = x.argmax(-1)
        return torch.where(nonfinite_rows(logits), torch.full_like(tokens, -1), tokens)
