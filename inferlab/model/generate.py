"""The generation steps, kept apart so a lab can swap exactly one (gpt-fast's ``generate.py``).

- ``prefill``: run the whole prompt at once (matrix-matrix work), filling the cache.
- ``decode_one_token``: run one new token per sequence against the cache (matrix-vector work).
- ``generate``: prefill, then decode until ``max_new_tokens``; greedy unless a temperature is set.
- ``generate_without_cache``: recompute the whole sequence for every new token: the O(n^2)
  baseline the KV cache exists to beat, and the oracle the cached path is checked against.
- ``generate_text``: the same two loops behind a tokenizer, for a real checkpoint
  (``inferlab.model.weights``): text in, text out.

Both loops check up front that the tokens fit (the model's context, the cache's capacity), so a
generation never fails halfway through.
"""

from __future__ import annotations

import torch

from inferlab.model.kv_cache import CacheFullError, KVCache
from inferlab.validation import positive_ints


def _as_batch(prompt) -> torch.Tensor:
    tokens = torch.as_tensor(prompt)
    if tokens.dim() == 1:
        tokens = tokens[None]
    if tokens.dim() != 2 or tokens.shape[1] == 0:
        raise ValueError("prompt must be a non-empty sequence of token ids, or a (batch, time) "
                         f"tensor; got shape {tuple(tokens.shape)}")
    return tokens


def _check_lengths(model, tokens: torch.Tensor, max_new_tokens: int) -> None:
    positive_ints(max_new_tokens=max_new_tokens)
    needed = tokens.shape[1] + max_new_tokens - 1  # positions the model must see
    if needed > model.config.max_seq_len:
        raise ValueError(f"a {tokens.shape[1]}-token prompt plus {max_new_tokens} new tokens "
                         f"needs {needed} positions, beyond the model's context of "
                         f"{model.config.max_seq_len}")


def sample(logits: torch.Tensor, temperature: float = 0.0,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Next tokens (B,) from logits (B, V): argmax at temperature 0, else a softmax sample."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.inference_mode()
def prefill(model, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run the prompt (B, T) through the model, storing its K/V; logits of the last token (B, V)."""
    positions = torch.arange(cache.length, cache.length + tokens.shape[1], device=tokens.device)
    return model(tokens, positions, cache, last_only=True)[:, -1]  # no logits for the others


@torch.inference_mode()
def decode_one_token(model, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run one token per sequence (B,) at the cache's next position; logits (B, V)."""
    positions = torch.arange(cache.length, cache.length + 1, device=token.device)
    return model(token.view(-1, 1), positions, cache)[:, -1]


@torch.inference_mode()
def generate(model, prompt, max_new_tokens: int, cache: KVCache | None = None,
             temperature: float = 0.0, seed: int = 0) -> torch.Tensor:
    """Prompt plus ``max_new_tokens`` generated tokens, shape (B, T + n), using a KV cache."""
    tokens = _as_batch(prompt).to(model.device)
    _check_lengths(model, tokens, max_new_tokens)
    total = tokens.shape[1] + max_new_tokens - 1  # the last token is sampled, never stored
    if cache is None:
        cache = KVCache.for_model(model, tokens.shape[0], max_len=total)
    if not hasattr(cache, "length"):  # e.g. a PagedKVCache: its rows have lengths of their own
        raise TypeError(f"generate() needs a cache that stores one length for the whole batch "
                        f"(cache.length), like inferlab.model.kv_cache.KVCache; a "
                        f"{type(cache).__name__} has none. Serve requests over a paged cache "
                        "with inferlab.serving.engine.serve")
    # Other caches (a lab's own, say) may not expose these; check what is there.
    if getattr(cache, "batch", tokens.shape[0]) != tokens.shape[0]:
        raise ValueError(f"the cache holds {cache.batch} sequences but the prompt has "
                         f"{tokens.shape[0]}")
    if hasattr(cache, "max_len") and cache.length + total > cache.max_len:
        raise CacheFullError(f"{cache.length} stored + {total} new tokens need "
                             f"{cache.length + total} slots but the cache holds {cache.max_len}; "
                             "build a larger cache or ask for fewer tokens")
    gen = torch.Generator(device=model.device).manual_seed(seed)
    out = [tokens]
    next_token = sample(prefill(model, tokens, cache), temperature, gen)
    out.append(next_token[:, None])
    for _ in range(max_new_tokens - 1):
        next_token = sample(decode_one_token(model, next_token, cache), temperature, gen)
        out.append(next_token[:, None])
    return torch.cat(out, dim=1)


@torch.inference_mode()
def generate_without_cache(model, prompt, max_new_tokens: int, temperature: float = 0.0,
                           seed: int = 0) -> torch.Tensor:
    """The same as ``generate`` but recomputing the whole sequence at every step (no cache)."""
    tokens = _as_batch(prompt).to(model.device)
    _check_lengths(model, tokens, max_new_tokens)
    gen = torch.Generator(device=model.device).manual_seed(seed)
    for _ in range(max_new_tokens):
        next_token = sample(model(tokens)[:, -1], temperature, gen)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
    return tokens


def generate_text(model, tokenizer, prompt: str, max_new_tokens: int = 32, use_cache: bool = True,
                  temperature: float = 0.0, seed: int = 0, stop_at_eos: bool = True) -> str:
    """Continue ``prompt`` (a string) and return only the new text.

    ``tokenizer`` is anything with ``encode(text) -> list[int]`` and ``decode(ids) -> str``
    (``inferlab.model.weights.load_tokenizer`` gives one). ``use_cache=False`` runs the recomputing
    loop instead: the same text, more slowly. Generation stops at the tokenizer's
    ``eos_token_id`` (when it has one) unless ``stop_at_eos`` is False.
    """
    ids = list(tokenizer.encode(prompt))
    if not ids:
        raise ValueError("the prompt encodes to no tokens; pass some text")
    prompt_ids = torch.tensor([ids], dtype=torch.long)
    if use_cache:
        out = generate(model, prompt_ids, max_new_tokens, temperature=temperature, seed=seed)
    else:
        out = generate_without_cache(model, prompt_ids, max_new_tokens, temperature=temperature,
                                     seed=seed)
    new = out[0, len(ids):].tolist()
    eos = getattr(tokenizer, "eos_token_id", None)
    eos_ids = set(eos if isinstance(eos, (list, tuple, set)) else [eos]) - {None}
    if stop_at_eos and eos_ids:
        for i, token in enumerate(new):
            if token in eos_ids:
                new = new[:i]
                break
    return tokenizer.decode(new)
