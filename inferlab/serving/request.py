"""A request, and the sequence the engine makes of it.

A ``Request`` is what a client sends: prompt token ids, how many tokens to generate at most,
when it arrives, the tokens that end it early (end-of-sequence), a temperature and a seed.
``validate_request`` refuses one the engine cannot serve, with a message that says why and the
field at fault; it is the one check every front door runs (``serve``, the online engine, the
HTTP server), so nothing a request carries can fail later, on the engine's thread. Inside the engine each
request becomes a ``Sequence``: its output so far, its status and its block table, which only
the scheduler changes (nano-vllm's ``sequence.py`` plays the same part).

One definition every part of the engine shares: a request that may generate ``n`` tokens stores
the K/V of at most ``longest_tokens(prompt_len, n) = prompt_len + n - 1`` tokens, because the
last token it samples is returned, never fed back through the model. The scheduler reserves by
it, the pool is sized by it and the simulators count by it.
"""

from __future__ import annotations

import enum
import math
import numbers
from dataclasses import dataclass, field

import torch

from inferlab.serving.block_manager import BlockTable, blocks_for
from inferlab.serving.sampling import is_greedy


def longest_tokens(prompt_len: int, max_new_tokens: int) -> int:
    """Tokens whose K/V a request stores at its longest: the prompt and all but the last output."""
    return prompt_len + max_new_tokens - 1


def _token_ids(ids) -> tuple:
    """``ids`` (a list, tuple, NumPy array or torch tensor) as a tuple; integers become ``int``.

    Anything that is not an integer (a float, a bool, a string) is kept as it is, so that
    ``validate_request`` can name it; the request is not refused here.
    """
    if hasattr(ids, "tolist"):  # NumPy arrays and torch tensors, of any integer dtype
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        return (ids,)
    return tuple(int(t) if isinstance(t, numbers.Integral) and not isinstance(t, bool) else t
                 for t in ids)


@dataclass(frozen=True)
class Request:
    """A prompt (token ids), at most ``max_new_tokens`` to generate, and when it arrives (s).

    Generation also ends at any token of ``eos_token_ids`` (that token is returned, as the last
    one). The prompt may be a list, a tuple, a NumPy array or a torch tensor of integers.
    ``temperature`` 0 samples greedily (the default), and so does any temperature below
    ``inferlab.serving.sampling.GREEDY_BELOW`` (1e-5); from there up to ``MAX_TEMPERATURE`` (2)
    the runner samples from the softmax of logits / temperature, with a generator of the
    request's own seeded by ``seed`` (random if None), drawn once per token it emits.
    ``top_k`` (0: off) keeps only the k likeliest tokens and ``top_p`` (1: off) the smallest set
    of them whose probability reaches p (nucleus sampling) before the draw.
    ``cache_salt`` names the prefix-cache namespace the request may share blocks in (None: the
    shared one; a server sets it per tenant).
    """

    prompt: tuple[int, ...]
    max_new_tokens: int
    arrival_s: float = 0.0
    request_id: object = None
    eos_token_ids: tuple[int, ...] = ()
    temperature: float = 0.0
    seed: int | None = None
    cache_salt: str | None = None
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", _token_ids(self.prompt))
        object.__setattr__(self, "eos_token_ids", _token_ids(self.eos_token_ids))


class InvalidRequestError(ValueError):
    """A request the engine cannot serve; the message says why and what would fix it.

    ``field`` names the request's field at fault (in the caller's vocabulary: an HTTP server
    passes its API's names), so that a server can say which parameter to change.
    """

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


# The bounds every front door shares (``serve``, ``OnlineEngine.submit``, the HTTP server).
# Temperature: OpenAI's Completions API and vLLM's SamplingParams both take [0, 2]; below
# ``inferlab.serving.sampling.GREEDY_BELOW`` a temperature decodes greedily.
MAX_TEMPERATURE = 2.0
# Seed: a 64-bit signed integer, the bound vLLM's OpenAI server puts on ``seed``
# (``torch.iinfo(torch.long)``); ``torch.Generator.manual_seed`` takes every value in it.
SEED_MIN, SEED_MAX = -2**63, 2**63 - 1


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def validate_request(request: Request, config, num_blocks: int | None = None,
                     block_size: int | None = None, names: dict[str, str] | None = None) -> None:
    """Raise ``InvalidRequestError`` unless ``request`` can run on a model shaped ``config``.

    With ``num_blocks`` and ``block_size``, also unless it fits a pool of that many blocks.
    Every field is checked, type and range, before anything runs: the prompt and end tokens
    (token ids in the vocabulary), ``max_new_tokens`` (a positive integer that fits the
    context), ``temperature`` (a finite number in [0, ``MAX_TEMPERATURE``]), ``seed`` (None or
    an integer in [``SEED_MIN``, ``SEED_MAX``]), ``top_k`` (an integer >= 0), ``top_p`` (in
    (0, 1]), ``arrival_s`` (a finite time >= 0) and
    ``cache_salt`` (None or a string). ``names`` maps the engine's field names to the caller's
    (an HTTP server's ``{"max_new_tokens": "max_tokens"}``), used in the messages and in the
    error's ``field``.
    """
    names = names or {}

    def refuse(key: str, message: str):
        raise InvalidRequestError(message.replace("{" + key + "}", names.get(key, key)),
                                  names.get(key, key))

    p, n, V = request.prompt, request.max_new_tokens, config.vocab_size
    if len(p) == 0:
        refuse("prompt", "the {prompt} is empty: a request needs at least one token")
    odd = next((t for t in p if not isinstance(t, int) or isinstance(t, bool)), None)
    if odd is not None:
        refuse("prompt", f"the {{prompt}} holds {odd!r} ({type(odd).__name__}); token ids are "
               "integers (a list, or an integer NumPy array or tensor)")
    if not all(0 <= t < V for t in p):
        refuse("prompt", f"the {{prompt}} holds token ids outside [0, {V})")
    if not all(isinstance(t, int) and 0 <= t < V for t in request.eos_token_ids):
        refuse("eos_token_ids", f"{{eos_token_ids}} must be token ids in [0, {V}), got "
               f"{request.eos_token_ids!r}")
    if len(p) > config.max_seq_len:
        refuse("prompt", f"the {{prompt}} has {len(p)} tokens but the model's context is "
               f"{config.max_seq_len}; shorten the {{prompt}}")
    if not _is_int(n) or n <= 0:
        refuse("max_new_tokens", f"{{max_new_tokens}} must be a positive integer, got {n!r}")
    if longest_tokens(len(p), n) > config.max_seq_len:
        refuse("max_new_tokens", f"{len(p)} prompt tokens + {n} new tokens exceed the model's "
               f"context of {config.max_seq_len}; lower {{max_new_tokens}} to at most "
               f"{config.max_seq_len - len(p) + 1}")
    t = request.temperature
    if not _is_real(t) or not math.isfinite(t) or not 0 <= t <= MAX_TEMPERATURE:
        refuse("temperature", f"{{temperature}} must be a finite number >= 0 and <= "
               f"{MAX_TEMPERATURE:g} (0: greedy), got {t!r}")
    seed = request.seed
    if seed is not None and (not _is_int(seed) or not SEED_MIN <= seed <= SEED_MAX):
        refuse("seed", f"{{seed}} must be an integer in [-2**63, 2**63 - 1] or null, got "
               f"{seed!r}")
    if not _is_int(request.top_k) or request.top_k < 0:
        refuse("top_k", f"{{top_k}} must be an integer >= 0 (0: every token), got "
               f"{request.top_k!r}")
    top_p = request.top_p
    if not _is_real(top_p) or not math.isfinite(top_p) or not 0 < top_p <= 1:
        refuse("top_p", f"{{top_p}} must be a number in (0, 1] (1: every token), got {top_p!r}")
    a = request.arrival_s
    if not _is_real(a) or not math.isfinite(a) or a < 0:
        refuse("arrival_s", f"{{arrival_s}} must be a finite time >= 0, got {a!r}")
    if request.cache_salt is not None and not isinstance(request.cache_salt, str):
        refuse("cache_salt", f"{{cache_salt}} must be a string or None, got "
               f"{type(request.cache_salt).__name__}")
    if num_blocks is not None:
        need = blocks_for(longest_tokens(len(p), n), block_size)
        if need > num_blocks:
            refuse("max_new_tokens", f"at its longest the request needs {need} KV blocks of "
                   f"{block_size} tokens but the cache has {num_blocks}; shorten the prompt "
                   "or lower {max_new_tokens}")


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request inside the engine. Only the ``Scheduler`` changes its fields."""

    seq_id: int
    prompt: tuple[int, ...]
    max_new_tokens: int
    arrival_s: float = 0.0
    output: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    table: BlockTable | None = None
    num_preemptions: int = 0
    eos_token_ids: frozenset[int] = frozenset()
    num_computed: int = 0  # leading tokens whose K/V the cache holds (0 after a preemption)
    temperature: float = 0.0  # 0: greedy
    generator: torch.Generator | None = None  # its own random stream when temperature > 0
    cache_salt: str | None = None  # its prefix-cache namespace (None: shared)
    top_k: int = 0  # sample among the k likeliest tokens only (0: all)
    top_p: float = 1.0  # ... and among the smallest set of them with probability >= top_p

    @classmethod
    def of(cls, seq_id: int, request: Request, arrival_s: float | None = None) -> "Sequence":
        """The sequence that serves ``request`` (arriving at ``arrival_s``, default the
        request's own)."""
        generator = None
        if not is_greedy(request.temperature):
            generator = torch.Generator()
            if request.seed is None:
                generator.seed()
            else:
                generator.manual_seed(int(request.seed))
        return cls(seq_id, request.prompt, request.max_new_tokens,
                   request.arrival_s if arrival_s is None else arrival_s,
                   eos_token_ids=frozenset(request.eos_token_ids),
                   temperature=float(request.temperature), generator=generator,
                   top_k=int(request.top_k), top_p=float(request.top_p),
                   cache_salt=request.cache_salt)

    @property
    def order(self) -> tuple[float, int]:
        """First come, first served: by arrival time, then by id."""
        return (self.arrival_s, self.seq_id)

    @property
    def tokens(self) -> list[int]:
        """The prompt and every token produced so far: what a (re)computing prefill runs."""
        return [*self.prompt, *self.output]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def num_uncomputed(self) -> int:
        """Tokens still to run through the model before the next one can be sampled: the whole
        prompt (and output) at admission, a prompt's remaining chunks, or 1 when decoding."""
        return self.num_tokens - self.num_computed

    def token_slice(self, start: int, n: int) -> list[int]:
        """Tokens ``start .. start + n - 1`` of prompt + output, without building the whole list."""
        p = len(self.prompt)
        if start >= p:
            return self.output[start - p:start - p + n]
        if start + n <= p:
            return list(self.prompt[start:start + n])
        return [*self.prompt[start:], *self.output[:start + n - p]]

    def row_start(self, n: int) -> int:
        """Where a forward row of ``n`` new tokens starts: at the first uncomputed token, or,
        for a finished sequence (a padding row, ``Step.padding``), at its table's last slot(s)
        (recomputed, the token dropped)."""
        return min(self.num_computed, self.table.num_tokens - n)

    def is_decode_row(self, n: int) -> bool:
        """Whether a forward row of ``n`` new tokens of this sequence decodes: one token after
        its whole prompt is computed (a finished sequence's padding row included)."""
        return n == 1 and bool(self.output) and self.num_computed >= len(self.prompt)

    @property
    def max_tokens(self) -> int:
        """Tokens whose K/V the sequence stores at its longest (``longest_tokens``)."""
        return longest_tokens(len(self.prompt), self.max_new_tokens)

    @property
    def stopped(self) -> bool:
        """Whether the last token produced is an end-of-sequence token."""
        return bool(self.output) and self.output[-1] in self.eos_token_ids

    @property
    def is_done(self) -> bool:
        return len(self.output) >= self.max_new_tokens or (
            bool(self.eos_token_ids) and self.stopped)

    @property
    def finish_reason(self) -> str | None:
        """"stop" (an end-of-sequence token), "length" (max_new_tokens), or None (not done)."""
        return "stop" if self.stopped else "length" if self.is_done else None

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, {self.status.value}, prompt={len(self.prompt)}, "
                f"output={len(self.output)}/{self.max_new_tokens}, computed={self.num_computed}, "
                f"preempted={self.num_preemptions})")
