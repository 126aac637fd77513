"""Validation: every check the package makes on what a caller hands it, worded one way.

Sizes: a size that is zero, negative or not a number would give a silently wrong result (an
empty cache, a division by zero much later); ``positive`` and ``positive_ints``, which every
constructor in the package calls, raise at once, naming the argument and the value.

Requests: ``validate_request`` refuses a request the serving engine cannot serve with an
``InvalidRequestError`` that says why and names the field at fault. Each front door runs it
once per request, before the request reaches the engine's loop (``serve`` for a list of
requests, ``OnlineEngine.submit`` for one arriving while it runs, which is what the HTTP server
calls), so nothing a request carries can fail later, on the engine's thread, where it would hit
the other requests of its step. It reads the request (``inferlab.serving.request.Request``),
the model's config and the engine's memory manager by their fields, and imports none of them:
this module stays on the ground floor, below every package that checks anything.
"""

from __future__ import annotations

import math
import numbers


def positive(prefix: str = "", **values: float) -> None:
    """Raise ``ValueError`` unless every value is a number greater than 0."""
    for name, value in values.items():
        if isinstance(value, bool) or not value > 0:
            raise ValueError(f"{prefix}{name} must be positive, got {value!r}")


def positive_ints(prefix: str = "", **values: int) -> None:
    """Raise ``ValueError`` unless every value is an ``int`` (not a bool) greater than 0."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{prefix}{name} must be a positive integer, got {value!r}")


# Temperature: OpenAI's Completions API and vLLM's SamplingParams both take [0, 2]; below
# ``inferlab.model.sampling.GREEDY_BELOW`` a temperature decodes greedily.
MAX_TEMPERATURE = 2.0
# Seed: a 64-bit signed integer, the bound vLLM's OpenAI server puts on ``seed``
# (``torch.iinfo(torch.long)``); ``torch.Generator.manual_seed`` takes every value in it.
SEED_MIN, SEED_MAX = -2**63, 2**63 - 1


class InvalidRequestError(ValueError):
    """A request the engine cannot serve; the message says why and what would fix it.

    ``field`` names the request's field at fault (in the caller's vocabulary: an HTTP server
    passes its API's names), so that a server can say which parameter to change.
    """

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def validate_request(request, config, memory=None, names: dict[str, str] | None = None) -> None:
    """Raise ``InvalidRequestError`` unless ``request`` (a ``Request``) can run on a model shaped
    ``config`` (a ``ModelConfig``: ``vocab_size``, ``max_seq_len``).

    With ``memory`` (the engine's memory manager: ``can_hold``, ``blocks_for``), also unless it
    fits that pool at its longest (``Request.max_tokens`` stored tokens).
    Every field is checked, type and range: the prompt and end tokens (token ids in the
    vocabulary), ``max_new_tokens`` (a positive integer that fits the context), ``temperature``
    (a finite number in [0, ``MAX_TEMPERATURE``]), ``seed`` (None or an integer in
    [``SEED_MIN``, ``SEED_MAX``]), ``top_k`` (an integer >= 0), ``top_p`` (in (0, 1]),
    ``arrival_s`` (a finite time >= 0) and ``cache_salt`` (None or a string). ``names`` maps the
    engine's field names to the caller's (an HTTP server's ``{"max_new_tokens": "max_tokens"}``),
    used in the messages and in the error's ``field``.
    """
    names = names or {}

    def refuse(key: str, message: str):
        raise InvalidRequestError(message.replace("{" + key + "}", names.get(key, key)),
                                  names.get(key, key))

    p, n, V = request.prompt, request.max_new_tokens, config.vocab_size
    if len(p) == 0:
        refuse("prompt", "the {prompt} is empty: a request needs at least one token")
    odd = next((t for t in p if not _is_int(t)), None)
    if odd is not None:
        refuse("prompt", f"the {{prompt}} holds {odd!r} ({type(odd).__name__}); token ids are "
               "integers (a list, or an integer NumPy array or tensor)")
    if not all(0 <= t < V for t in p):
        refuse("prompt", f"the {{prompt}} holds token ids outside [0, {V})")
    if not all(_is_int(t) and 0 <= t < V for t in request.eos_token_ids):
        refuse("eos_token_ids", f"{{eos_token_ids}} must be token ids in [0, {V}), got "
               f"{request.eos_token_ids!r}")
    if len(p) > config.max_seq_len:
        refuse("prompt", f"the {{prompt}} has {len(p)} tokens but the model's context is "
               f"{config.max_seq_len}; shorten the {{prompt}}")
    if not _is_int(n) or n <= 0:
        refuse("max_new_tokens", f"{{max_new_tokens}} must be a positive integer, got {n!r}")
    if request.max_tokens > config.max_seq_len:
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
    if memory is not None and not memory.can_hold(request.max_tokens):
        refuse("max_new_tokens", f"at its longest the request needs "
               f"{memory.blocks_for(request.max_tokens)} KV blocks of {memory.block_size} tokens "
               f"but the cache has {memory.num_blocks}; shorten the prompt or lower "
               "{max_new_tokens}")
