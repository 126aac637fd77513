"""The generation steps, kept apart so a lab can swap exactly one (gpt-fast's ``generate.py``).

- ``prefill``: run the whole prompt at once (matrix-matrix work), filling the cache.
- ``decode_one_token``: run one new token per sequence against the cache (matrix-vector work).
- ``generate``: prefill, then decode until ``max_new_tokens``, or until every sequence has
  produced an end-of-sequence token when one is given; greedy unless a temperature is set
  (``inferlab.model.sampling.sample``, the engine's own sampling: one rule for both).
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
from inferlab.model.sampling import sample
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


def _eos_ids(eos_token_id, device) -> torch.Tensor | None:
    """The end-of-sequence id(s) as a 1-D tensor, or None when generation should not stop."""
    if eos_token_id is None:
        return None
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return torch.tensor(ids, dtype=torch.long, device=device) if ids else None


def _stop_finished(token: torch.Tensor, done: torch.Tensor, eos: torch.Tensor | None):
    """Sequences that have already ended keep repeating their end-of-sequence token; returns
    the tokens to append and the updated mask of ended sequences (B,)."""
    if eos is None:
        return token, done
    token = torch.where(done, token.new_tensor(int(eos[0])), token)
    return token, done | torch.isin(token, eos)


def next_tokens(logits: torch.Tensor, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Next tokens (B,) from logits (B, V), every row at ``temperature`` drawing from the one
    ``generator``: ``sample``, the engine's rule (greedy below ``GREEDY_BELOW``)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    B = logits.shape[0]
    tokens = sample(logits, torch.full((B,), float(temperature)), [generator] * B)
    return torch.tensor(tokens, device=logits.device)


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
             temperature: float = 0.0, seed: int = 0, eos_token_id=None) -> torch.Tensor:
    """Prompt plus up to ``max_new_tokens`` generated tokens, shape (B, T + n), with a KV cache.

    With ``eos_token_id`` (an id or a list of ids), a sequence ends at the first one it
    produces; a batch's ended sequences are padded with ``eos_token_id`` (the first, if a list)
    until all have ended, and the loop stops there, so n may be less than ``max_new_tokens``.
    """
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
    eos, done = _eos_ids(eos_token_id, model.device), torch.zeros(tokens.shape[0], dtype=torch.bool,
                                                                  device=model.device)
    out = [tokens]
    next_token, done = _stop_finished(next_tokens(prefill(model, tokens, cache), temperature, gen),
                                      done, eos)
    out.append(next_token[:, None])
    for _ in range(max_new_tokens - 1):
        if eos is not None and bool(done.all()):
            break
        next_token, done = _stop_finished(
            next_tokens(decode_one_token(model, next_token, cache), temperature, gen), done, eos)
        out.append(next_token[:, None])
    return torch.cat(out, dim=1)


@torch.inference_mode()
def generate_without_cache(model, prompt, max_new_tokens: int, temperature: float = 0.0,
                           seed: int = 0, eos_token_id=None) -> torch.Tensor:
    """The same as ``generate`` but recomputing the whole sequence at every step (no cache)."""
    tokens = _as_batch(prompt).to(model.device)
    _check_lengths(model, tokens, max_new_tokens)
    gen = torch.Generator(device=model.device).manual_seed(seed)
    eos, done = _eos_ids(eos_token_id, model.device), torch.zeros(tokens.shape[0], dtype=torch.bool,
                                                                  device=model.device)
    for _ in range(max_new_tokens):
        if eos is not None and bool(done.all()):
            break
        next_token, done = _stop_finished(next_tokens(model(tokens)[:, -1], temperature, gen), done,
                                          eos)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
    return tokens


def check_vocabulary(model, tokenizer) -> None:
    """Refuse a tokenizer that can produce ids the model has no embedding for (another
    checkpoint's tokenizer). A model's table may be larger than its tokenizer (padding rows)."""
    size = getattr(tokenizer, "vocab_size", None)
    if size is not None and size > model.config.vocab_size:
        where = getattr(tokenizer, "path", None)
        raise ValueError(f"the tokenizer {where / 'tokenizer.json' if where else ''} has {size} "
                         f"tokens but the model has {model.config.vocab_size} (vocab_size in its "
                         "config.json): they belong to different checkpoints. Load both from "
                         "the same directory: load_checkpoint(path) and load_tokenizer(path)")


def generate_text(model, tokenizer, prompt: str, max_new_tokens: int = 32, use_cache: bool = True,
                  temperature: float = 0.0, seed: int = 0, stop_at_eos: bool = True) -> str:
    """Continue ``prompt`` (a string) and return only the new text.

    ``tokenizer`` is anything with ``encode(text) -> list[int]`` and ``decode(ids) -> str``
    (``inferlab.model.weights.load_tokenizer`` gives one). ``use_cache=False`` runs the recomputing
    loop instead: the same text, more slowly. Generation stops at the tokenizer's
    ``eos_token_id`` (when it has one) unless ``stop_at_eos`` is False.
    """
    check_vocabulary(model, tokenizer)
    ids = list(tokenizer.encode(prompt))
    if not ids:
        raise ValueError("the prompt encodes to no tokens; pass some text")
    prompt_ids = torch.tensor([ids], dtype=torch.long)
    eos = getattr(tokenizer, "eos_token_id", None)
    eos_ids = set(eos if isinstance(eos, (list, tuple, set)) else [eos]) - {None}
    loop = generate if use_cache else generate_without_cache
    out = loop(model, prompt_ids, max_new_tokens, temperature=temperature, seed=seed,
               eos_token_id=sorted(eos_ids) if stop_at_eos and eos_ids else None)
    new = out[0, len(ids):].tolist()
    if stop_at_eos and eos_ids:
        for i, token in enumerate(new):
            if token in eos_ids:
                new = new[:i]
                break
    return tokenizer.decode(new)
