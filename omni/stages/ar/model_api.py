"""The contract between the AR engine and a model adapter (thinker, talker, any LLM).

The engine owns scheduling, the paged KV cache and sampling; the model owns its weights
and everything model-specific. Per step the engine calls, in order:

1. `input_embeds(seq, start, end)` and `positions(seq, start, end)` for every scheduled
   span of every sequence (a prefill chunk, or one decode token), to build a flat batch;
2. `forward(batch) -> ForwardOutput`, once, over the flat batch of T tokens;
3. `compute_logits(hidden)` on the last row of each sequence that reached its end;
4. the sampler, then `after_sample(seqs, token_ids, hidden)` for those sequences.

`prepare(seq, inputs)` runs once in `add_request` and `release(seq)` when the sequence
finishes or is aborted. `input_ready(seq)` is polled by the scheduler: returning False
parks the sequence (it keeps its blocks) until the adapter has what its next step needs,
e.g. the talker waiting for the thinker's next hidden state.

Rules an adapter must keep:
- Inputs are a pure function of (sequence state, position): the engine may preempt a
  sequence and recompute any span from position 0, and chunked prefill splits spans
  anywhere. Keep whatever `input_embeds` needs in `seq.model_state` until `release`.
- Attention goes through `batch.attend(layer, q, k, v)`; it stores k/v in the paged cache.
- Hidden-state taps follow transformers' `output_hidden_states` indexing: tap 0 is the
  input embeddings (after any multimodal merge), tap i (1 <= i < num_layers) the output of
  decoder layer i-1, tap num_layers the final normed hidden. Return every tap in
  `batch.tap_layers` for every token of the batch.
- Prefix caching: `prefix_key(seq, start, end)` says what, besides the token ids, decides the
  keys/values of the full block [start, end) given those of the positions before it (embeddings,
  rope positions, any per-sequence input `forward` reads). A cache hit must give the KV that
  recomputing would, so a model that cannot say returns None and its sequence is not cached
  from that block on. The default is safe: token ids alone (b"") for an adapter that overrides
  none of `prepare`, `input_embeds`, `positions`; None otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from omni.kernel.errors import InvalidRequest
from omni.layers.paged_attention import AttentionMetadata, paged_attention

if TYPE_CHECKING:
    from omni.stages.ar.sequence import Sequence


@dataclass
class KVCacheSpec:
    """What the engine allocates for a model: the paged KV cache and the sampler's per-slot rows."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float32
    vocab_size: int = 0  # width of `compute_logits`


@dataclass(frozen=True)
class DecodeForm:
    """The shape of a model's decode-step inputs, so that every decode graph can be captured at
    start-up: whether rows come as embeddings, and the rope positions' leading dims and dtype."""

    embeds: bool = False
    pos_lead: tuple[int, ...] = ()
    pos_dtype: torch.dtype = torch.long


@dataclass
class SeqSpan:
    """One sequence's slice of the flat batch: positions [start, end) at rows [row, row + end - start)."""

    seq: "Sequence"
    start: int
    end: int
    row: int

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


@dataclass
class ForwardBatch:
    """One step's flat batch of T tokens from B sequences (prefill chunks and decodes mixed)."""

    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] or [P, T] (e.g. M-RoPE [3, T]), long or float, from `ARModel.positions`
    inputs_embeds: torch.Tensor | None  # [T, H] when any sequence supplied embeddings, else None
    spans: list[SeqSpan]
    attn: AttentionMetadata
    kv_cache: torch.Tensor  # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
    tap_layers: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode(self) -> bool:
        return self.attn.is_decode

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None):
        """Causal attention of this step's q ([T, Hq, D]) over each sequence's cached context.

        Writes k, v ([T, Hkv, D], after RoPE) into the cache first; returns [T, Hq, D].
        `scale` defaults to 1/sqrt(D).
        """
        return paged_attention(self.kv_cache, layer, self.attn, q, k, v, scale)


@dataclass
class ForwardOutput:
    hidden: torch.Tensor  # [T, H] final hidden (what `compute_logits` takes)
    taps: dict[int, torch.Tensor] = field(default_factory=dict)  # tap index -> [T, H]
    tokens: torch.Tensor | None = None  # [T] sampled inside a decode graph (-1: non-finite logits)


@dataclass
class AfterSample:
    """`after_sample`'s answer when it brought the step's token ids to the host with its own copy."""

    extras: list[dict]
    token_ids: list[int]


class PendingSample:
    """`after_sample`'s answer while its copy to the host is still in flight: `resolve()` waits for it
    and gives the `AfterSample`. The engine may launch the next decode step first (lookahead.py)."""

    def __init__(self, finish: Callable[[], AfterSample]) -> None:
        self._finish = finish

    def resolve(self) -> AfterSample:
        return self._finish()


class ARModel:
    """Base class of model adapters; override the required methods and any hooks.

    Required: `kv_cache_spec`, `embed_tokens`, `forward`, `compute_logits`.
    A subclass may also be an `nn.Module` (list `nn.Module` first in the bases).
    `decode_form` (with `supports_cuda_graphs`) lets the engine capture every decode graph at
    start-up; `logits_processors` are the model's rules, run inside the one sampler.
    """

    supports_cuda_graphs = False
    decode_form: DecodeForm | None = None
    # True: a decode step's inputs never read the last sampled ids on the host (they are built from
    # device state that `after_sample` keeps, e.g. the talker's frame embeddings, or are the ids, which the
    # engine feeds on the device), and `after_sample` returns a `PendingSample` or nothing (no host copy of
    # its own): the engine may launch step N+1 before step N's ids arrive (lookahead.py)
    lookahead_decode = False

    def logits_processors(self) -> list:
        """`omni.stages.ar.sampler.LogitsProcessor`s applied to every row (e.g. suppressed ids)."""
        return []

    def kv_cache_spec(self) -> KVCacheSpec:
        raise NotImplementedError

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] token ids -> [T, H] embeddings (used to fill rows of sequences without embeds)."""
        raise NotImplementedError

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] -> [N, vocab] logits (any float dtype; the sampler works in float32)."""
        raise NotImplementedError

    # ---- optional hooks -------------------------------------------------------------
    def prepare(self, seq: "Sequence", inputs: dict[str, Any]) -> None:
        """Validate a new request's extra inputs and keep what later steps need in
        `seq.model_state`. Raise `omni.kernel.errors.InvalidRequest` for bad input."""
        if inputs:
            raise InvalidRequest(f"{type(self).__name__} takes no extra inputs, got {sorted(inputs)}")

    def input_embeds(self, seq: "Sequence", start: int, end: int) -> torch.Tensor | None:
        """[end - start, H] input embeddings for those positions, or None to embed the token ids."""
        return None

    def decode_inputs(self, seqs: list["Sequence"], starts: list[int]) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """A decode step's inputs for one new position per sequence at once: rope positions [n] or
        [P, n] (a CPU tensor, as `positions` gives them concatenated) and input embeddings [n, H] (or
        None, as `input_embeds`), equal to asking row by row; None: ask row by row. Per row, those
        are a few small tensor ops each (a launch each on a GPU): at 64 rows a millisecond a step."""
        return None

    def positions(self, seq: "Sequence", start: int, end: int) -> torch.Tensor:
        """Rope positions of [start, end): [n] long by default; [P, n] for multi-axis rope
        (float allowed: Qwen3-Omni video positions can be fractional). Every sequence of one
        model must return the same shape and dtype (they are concatenated)."""
        return torch.arange(start, end, dtype=torch.long)

    def prefix_key(self, seq: "Sequence", start: int, end: int) -> bytes | None:
        """The content key of the full block [start, end) beyond its token ids, or None to keep
        it and the rest of `seq` out of the prefix cache (see the module's rules)."""
        cls = type(self)
        if cls.prepare is ARModel.prepare and cls.input_embeds is ARModel.input_embeds and cls.positions is ARModel.positions:
            return b""
        return None

    def input_ready(self, seq: "Sequence") -> bool:
        """False parks `seq` until the adapter has the input its next step needs."""
        return True

    def after_sample(self, seqs: list["Sequence"], tokens: torch.Tensor, hidden: torch.Tensor
                     ) -> list[dict] | AfterSample | PendingSample | None:
        """Runs after sampling, before stop checks and before the tokens reach the host:
        `tokens` [N] on the device (-1 for a row whose logits were not finite), `hidden` [N, H]
        the rows that made the logits. May return one dict per sequence; the engine passes it
        on as `StepOutput.extra` (e.g. the talker's other codebook codes). A model that copies
        the tokens to the host itself returns `AfterSample` with them: the step syncs once (or a
        `PendingSample` while that copy is in flight)."""
        return None

    def release(self, seq: "Sequence") -> None:
        """The sequence finished or was aborted: drop its per-sequence state."""
        seq.model_state.clear()
