"""The engine's one validated config object, built at the entry and passed whole (a stage's
typed args, `omni.stages.ar.args.ARArgs`, carry these fields and build it)."""

from __future__ import annotations

from dataclasses import dataclass

from omni.kernel.errors import InvalidRequest


ATTENTION_BACKENDS = ("auto", "torch", "triton")


class EngineConfigError(InvalidRequest):
    """An engine setting is invalid (names the field)."""


KV_TOKENS_PER_SEQ = 2048  # on CUDA, the KV tokens each slot gets when num_blocks is left to the engine
CPU_NUM_BLOCKS = 256


@dataclass
class EngineConfig:
    """Sizes and limits of one AR engine.

    `num_blocks` x `block_size` token slots make the KV cache; it must hold at least one
    sequence of `max_model_len` tokens so that the oldest sequence can always make progress
    (preemption frees every other sequence's blocks if needed). With `enable_prefix_caching`,
    blocks nobody holds keep their content until an allocation needs them; a model takes part
    through `ARModel.prefix_key` (sequences of models that cannot say what decides their KV are
    never cached).
    """

    block_size: int = 16
    num_blocks: int = 0  # KV blocks; 0: sized by `auto_blocks` (per slot on CUDA)
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True  # reuse computed full blocks of earlier prompts (block_manager.py)
    device: str = "cpu"
    dtype: str = ""  # KV cache dtype; "" = the model's dtype
    tap_layers: tuple[int, ...] = ()  # hidden-state taps: 0 = embeddings, i = output of layer i
    eos_token_ids: tuple[int, ...] = ()
    cuda_graphs: bool | None = None  # replay decode steps from CUDA graphs (models with supports_cuda_graphs); None: on CUDA
    cuda_graph_max_batch: int = 0  # largest captured decode batch; 0 = max_num_seqs
    attention_backend: str = "auto"  # "triton": paged decode kernel (prefill stays torch); "auto": triton on CUDA
    # steps that prefill (admissions, prompt chunks) apart from decode steps, alternating while both wait,
    # so that decode steps stay on their CUDA graphs (a mixed step runs eagerly; with one arrival a step
    # at 64 streams every step was mixed); None: with decode graphs
    split_prefill: bool | None = None
    # with prefill steps apart: decode steps between two prefill steps while decodes run (1: they alternate; k:
    # an arrival waits up to k decode steps and the arrivals of those steps are prefilled together, fewer prefill
    # steps at high load; a prefill still runs at once when the slots it could fill are all asked for)
    prefill_interval: int = 1
    # launch a decode step before the previous one's ids reach the host, for models whose decode inputs
    # stay on the device (the talkers; lookahead.py): the host's half of a step overlaps the GPU's; None:
    # with decode graphs
    lookahead_decode: bool | None = None
    tensor_parallel_size: int = 1  # ranks one replica's model is split over (tensor_parallel.py; SGLang's tp_size)

    @property
    def graphs_on(self) -> bool:
        """Decode graphs: `cuda_graphs` when set, else on wherever the engine runs on CUDA (the fast path
        is the default one; `cuda_graphs=false` turns them off)."""
        return str(self.device).startswith("cuda") if self.cuda_graphs is None else bool(self.cuda_graphs)

    @property
    def lookahead_on(self) -> bool:
        """Lookahead decode steps: `lookahead_decode` when set, else with decode graphs."""
        return self.graphs_on if self.lookahead_decode is None else bool(self.lookahead_decode)

    @property
    def prefill_apart(self) -> bool:
        """Prefill steps apart from decode steps: `split_prefill` when set, else with decode graphs."""
        return self.graphs_on if self.split_prefill is None else bool(self.split_prefill)

    def auto_blocks(self) -> int:
        """The KV cache when `num_blocks` is 0: on CUDA `KV_TOKENS_PER_SEQ` tokens for each of
        `max_num_seqs` slots (256 blocks, 4,096 tokens for every stream together, had one H200's
        64 streams queue for KV while the slots and the GPU idled: RESULTS 2026-12-04); on the CPU
        256 blocks; always at least one `max_model_len` sequence."""
        longest = -(-int(self.max_model_len) // int(self.block_size))
        if not str(self.device).startswith("cuda"):
            return max(CPU_NUM_BLOCKS, longest)
        return max(-(-KV_TOKENS_PER_SEQ * int(self.max_num_seqs) // int(self.block_size)), longest)

    def __post_init__(self) -> None:
        if int(self.num_blocks) == 0:
            self.num_blocks = self.auto_blocks()
        self.tap_layers = tuple(int(x) for x in self.tap_layers)
        self.eos_token_ids = tuple(int(x) for x in self.eos_token_ids)
        for name in ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "prefill_interval"):
            if int(getattr(self, name)) < 1:
                raise EngineConfigError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise EngineConfigError(f"EngineConfig.attention_backend must be one of {ATTENTION_BACKENDS}, "
                                    f"got {self.attention_backend!r}")
        if int(self.tensor_parallel_size) < 1:
            raise EngineConfigError(f"EngineConfig.tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.cuda_graph_max_batch < 0:
            raise EngineConfigError(f"EngineConfig.cuda_graph_max_batch must be >= 0, got {self.cuda_graph_max_batch}")
        if self.num_blocks * self.block_size < self.max_model_len:
            raise EngineConfigError(
                f"KV cache of {self.num_blocks} blocks x {self.block_size} tokens cannot hold one "
                f"sequence of max_model_len={self.max_model_len}"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise EngineConfigError(
                "without chunked prefill max_num_batched_tokens must be >= max_model_len "
                f"({self.max_num_batched_tokens} < {self.max_model_len})"
            )
