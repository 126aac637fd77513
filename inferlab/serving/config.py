"""One configuration for a serving run: every size the engine reads, in one checked object.

nano-vllm hands one ``Config`` to its scheduler, its block manager and its model runner; the
engine here does the same with ``ServingConfig``. The KV pool (``num_blocks`` blocks of
``block_size`` tokens), the scheduler's limits (``max_batch`` sequences at once,
``max_prefill_tokens`` prompt tokens a step), the admission ``watermark`` and the scheduling
``policy`` are fields of one frozen dataclass that checks itself when it is made. The cache and
the scheduler both read the block size from it, so they cannot disagree about it.

``token_budget`` switches the engine to chunked prefill (Sarathi-Serve, Agrawal et al. 2024;
vLLM calls the budget ``max_num_batched_tokens``): every step is then ONE forward pass of at
most that many tokens, filled first by the running decodes (one token each) and then by prefill
chunks, oldest request first, so that a prompt may span several steps. A budget alone
selects ``policy="chunked"`` (``inferlab.serving.scheduler.chunked_policy``); a policy function
of one's own may use it too. Without it, a step prefills each admitted prompt whole, in a forward pass of its
own, before the decode batch (the engine of Chapter 4).

``kv_cache_dtype="int8"`` stores K and V as int8 codes with a float32 scale per token and head
(``inferlab.serving.paged_int8``): nearly four times the tokens of a float32 pool in the same
bytes, at the rounding Chapter 5 measures.

``overlap=True`` runs the engine one step ahead of its forward passes
(``inferlab.serving.overlap``: SGLang's overlap scheduler, vLLM's async scheduling): the next
step is scheduled and its inputs built while the current one runs, with the same tokens.

``num_blocks`` may be left ``None`` when a config is handed to ``inferlab.serving.engine.serve``,
which then sizes the pool from the requests it accepts (and never beyond the device's memory).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from inferlab.validation import positive, positive_ints

BLOCK_SIZE = 16  # tokens per KV block: vLLM's default, and the course's everywhere
KV_CACHE_DTYPES = (None, "int8")  # None: K/V in the model's dtype (inferlab.serving.paged_int8)
GIB = 1 << 30


def engine_max_batch(device_name: str, memory_bytes: float) -> int:
    """The cap on running sequences vLLM sets when ``max_num_seqs`` is left unset, for a GPU
    called ``device_name`` reporting ``memory_bytes``: 1,024 on GPUs of 70 GiB or more other
    than the A100 (the H100, H200, B200, MI300X), else 256 (engine fact
    ``vllm-max-num-seqs-defaults``: ``EngineArgs`` picks both by device). The simulated
    servers of Chapters 4, 7 and 8 use it, so that their batches are capped where a default
    vLLM server's would be, not by a number of the course's own."""
    if memory_bytes >= 70 * GIB and "a100" not in device_name.lower():
        return 1024
    return 256



@dataclass(frozen=True)
class ServingConfig:
    """The sizes and the policy of one engine (or one simulated engine)."""

    block_size: int = BLOCK_SIZE          # tokens per KV block
    num_blocks: int | None = None         # blocks in the pool; None: serve() sizes it
    max_batch: int = 32                   # sequences running at once (vLLM's max_num_seqs)
    max_prefill_tokens: int | None = None  # prompt tokens one step may prefill; None: no limit
    policy: str | Callable | None = None  # "continuous", "static", "chunked", or a function
    # policy(scheduler, now) (dynamic batching: scheduler.make_static_policy(max_wait_s));
    # None: "chunked" with a token_budget, else "continuous"
    watermark: float = 0.0                # share of the blocks an admission must leave free
    token_budget: int | None = None       # chunked prefill: tokens one step's forward may run
    kv_cache_dtype: str | None = None     # "int8": K/V as int8 codes + scales; None: the model's
    # decode rows that share cached prefix blocks attend to them once, together (cascade
    # attention, inferlab.serving.shared_prefix); outputs equal per-sequence attention
    shared_prefix_attention: bool = False
    # blocks of a second KV tier below the pool (host memory under a GPU pool, a file under a
    # CPU one) that keeps the prefix blocks the pool evicts; needs prefix caching
    kv_tier_blocks: int | None = None
    # overlap scheduling: schedule and prepare the next step while this one's forward runs
    # (inferlab.serving.overlap); the tokens are the same, the host time hides behind the forward
    overlap: bool = False

    def __post_init__(self) -> None:
        if self.policy is None:  # a token budget alone means chunked prefill
            object.__setattr__(self, "policy", "continuous" if self.token_budget is None
                               else "chunked")
        positive_ints("ServingConfig.", block_size=self.block_size, max_batch=self.max_batch)
        if self.num_blocks is not None:
            positive_ints("ServingConfig.", num_blocks=self.num_blocks)
        if self.max_prefill_tokens is not None:
            positive("ServingConfig.", max_prefill_tokens=self.max_prefill_tokens)
        if not isinstance(self.policy, str) and not callable(self.policy):
            raise ValueError(f"ServingConfig.policy must be a policy name or a function "
                             f"policy(scheduler, now) -> Step, got {self.policy!r}")
        if isinstance(self.watermark, bool) or not 0 <= self.watermark < 1:
            raise ValueError(f"ServingConfig.watermark must lie in [0, 1), got {self.watermark!r}")
        if self.token_budget is not None:
            positive_ints("ServingConfig.", token_budget=self.token_budget)
            if self.token_budget < self.max_batch:
                raise ValueError(f"ServingConfig.token_budget={self.token_budget} is below "
                                 f"max_batch={self.max_batch}: every running sequence's decode "
                                 "token must fit in one step")
            if self.policy in ("continuous", "static"):
                raise ValueError(f"token_budget is chunked prefill's; policy={self.policy!r} "
                                 "prefills whole prompts. Use policy='chunked'")
            if self.max_prefill_tokens is not None:
                raise ValueError("give token_budget (chunked prefill) or max_prefill_tokens "
                                 "(whole prompts), not both")
        elif self.policy == "chunked":
            raise ValueError("policy='chunked' needs token_budget: the tokens one step may run")
        if self.kv_tier_blocks is not None:
            positive_ints("ServingConfig.", kv_tier_blocks=self.kv_tier_blocks)
        if not isinstance(self.overlap, bool):
            raise ValueError(f"ServingConfig.overlap must be True or False, got {self.overlap!r}")
        if self.overlap and self.kv_tier_blocks:
            raise ValueError("overlap scheduling and a KV tier do not go together yet: the tier "
                             "copies blocks on the host while a forward may still write them")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"ServingConfig.kv_cache_dtype must be one of {KV_CACHE_DTYPES}, "
                             f"got {self.kv_cache_dtype!r}")

    @property
    def chunked(self) -> bool:
        """Whether each step is one forward pass of decodes and prefill chunks: the one place
        the engine decides it (the scheduler lays each step out by it)."""
        return self.token_budget is not None

    def replace(self, **changes) -> "ServingConfig":
        """A copy with some fields changed (checked again), e.g. ``config.replace(num_blocks=64)``."""
        return replace(self, **changes)
