"""Speculative decoding: a cheap drafter proposes k tokens, one target forward pass verifies them.

At batch 1 a decode step reads every weight to produce one token, and a forward pass over k + 1
tokens reads the same weights: while k is small it costs about one step. Speculative decoding
(Leviathan, Kalman and Matias 2023; Chen et al. 2023) spends that slack. A drafter proposes
d_1..d_k; the target runs once over [last, d_1, .., d_k] and so has its own distribution at
every drafted position; the verifier keeps the longest prefix the target agrees with and adds
one token of the target's own, so every verification emits between 1 and k + 1 tokens.

Read in this order:

- ``greedy_verify``: at temperature 0, keep d_i while it equals the target's argmax; the output
  is then the target's own greedy output, token for token.
- ``sampling_verify``: the rejection rule. Accept d_i with probability min(1, p(d_i) / q(d_i));
  on the first rejection sample from the residual norm(max(0, p - q)); after k acceptances
  sample a bonus token from p. Every emitted token is distributed exactly as the target's.
- ``rollback``: forget the K/V of rejected positions in a ``KVCache`` (its length goes back);
  the paged cache does the same with ``BlockTable.truncate`` (``inferlab.serving.paged_cache``).
- Drafters: ``ModelDrafter`` (a small model with its own cache) and ``PromptLookup`` (copy the
  tokens that followed the last earlier occurrence of the current n-gram: no model at all;
  Saxena's prompt-lookup decoding, in Hugging Face as ``prompt_lookup_num_tokens``).
- ``speculative_generate``: the loop, with ``SpecStats`` counting what was drafted and kept.

Both caches keep one invariant: between verifications they hold every committed token except the
last one, which is the next forward pass's input. Batch 1 only: at large batch the step is no
longer memory-bound and speculation stops paying (``inferlab.analysis.speculation``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inferlab.model.kv_cache import KVCache


def greedy_verify(logits: torch.Tensor, drafted: torch.Tensor) -> list[int]:
    """Tokens to emit, given the target's logits (k + 1, V) at [last, d_1..d_k] and d (k,).

    Row i of ``logits`` predicts the token after position i, so d_{i+1} is kept while it equals
    argmax(row i); at the first mismatch the target's argmax replaces it, and after k matches
    the last row gives a bonus token.
    """
    choice = logits.argmax(dim=-1).tolist()  # (k + 1,) the target's own greedy tokens
    out = []
    for i, d in enumerate(drafted.tolist()):
        if d != choice[i]:
            break
        out.append(d)
    out.append(choice[len(out)])
    return out


def sampling_verify(p: torch.Tensor, q: torch.Tensor, drafted: torch.Tensor,
                    generator: torch.Generator | None = None) -> list[int]:
    """The rejection rule: p (k + 1, V) target probabilities, q (k, V) the drafter's, d (k,).

    Token x = d_i was drawn from q_i; keep it with probability min(1, p_i(x) / q_i(x)). Then
    P(keep x) = min(q(x), p(x)), and a rejection happens with probability 1 - sum min(p, q); the
    replacement drawn from max(0, p - q) / (that same sum) tops every x up to exactly p(x).
    """
    out = []
    for i, d in enumerate(drafted.tolist()):
        r = float(torch.rand((), generator=generator))
        if r * float(q[i, d]) < float(p[i, d]):  # r < p / q, without dividing by zero
            out.append(d)
            continue
        residual = (p[i] - q[i]).clamp(min=0)
        if float(residual.sum()) <= 0:  # p == q: a rejection has probability 0
            residual = p[i]
        out.append(int(torch.multinomial(residual, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(p[len(drafted)], 1, generator=generator)))  # the bonus
    return out


def rollback(cache: KVCache, length: int) -> None:
    """Keep the first ``length`` positions of ``cache``; later writes overwrite the rest.

    The buffers are preallocated, so rolling back is a change of length, not a free; the paged
    cache frees whole blocks instead (``BlockTable.truncate``).
    """
    if not 0 <= length <= cache.length:
        raise ValueError(f"cannot roll back to {length} tokens: the cache holds {cache.length}")
    cache.length = length


class ContiguousTarget:
    """The target's side of the loop over a preallocated ``KVCache``: run tokens, roll back."""

    def __init__(self, model, max_len: int):
        self.model = model
        self.cache = KVCache.for_model(model, batch=1, max_len=max_len)

    def forward(self, tokens: list[int], start: int) -> torch.Tensor:
        """Logits (T, V) of ``tokens`` placed at positions start.. (the cache holds ``start``)."""
        dev = self.model.device
        x = torch.tensor([tokens], device=dev)
        return self.model(x, torch.arange(start, start + len(tokens), device=dev), self.cache)[0]

    def keep(self, n: int) -> None:
        rollback(self.cache, n)


class PagedTarget(ContiguousTarget):
    """The same over the serving engine's paged pool: a verification appends k + 1 slots to the
    sequence's block table and ``keep`` truncates it, so rejected blocks go back to the pool."""

    def __init__(self, model, cache, truncate=None):
        self.model, self.cache = model, cache  # an inferlab.serving.paged_cache.PagedKVCache
        self.table = cache.new_table()
        self.truncate = truncate or (lambda table, n: table.truncate(n))  # a lab swaps it

    def forward(self, tokens: list[int], start: int) -> torch.Tensor:
        self.table.append(len(tokens))
        self.cache.bind([self.table])
        return super().forward(tokens, start)

    def keep(self, n: int) -> None:
        self.truncate(self.table, n)


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.double() / temperature, dim=-1)


class ModelDrafter:
    """A small model drafting greedily (or by sampling at ``temperature``), with its own cache."""

    def __init__(self, model, max_len: int | None = None):
        self.model = model
        self.cache = KVCache.for_model(model, batch=1, max_len=max_len)  # default: its context

    @torch.inference_mode()
    def propose(self, tokens: list[int], k: int, temperature: float = 0.0,
                generator: torch.Generator | None = None):
        """Up to ``k`` drafted tokens after ``tokens`` and their distributions (k, V), or None
        when they are deterministic (temperature 0)."""
        if k == 0:
            return [], None
        new = tokens[self.cache.length:]  # what the cache lacks: the last token, maybe two
        drafted, probs = [], []
        x = torch.tensor([new], device=self.model.device)
        for _ in range(k):
            positions = torch.arange(self.cache.length, self.cache.length + x.shape[1],
                                     device=self.model.device)
            logits = self.model(x, positions, self.cache, last_only=True)[0, -1]  # (V,)
            if temperature == 0:
                d = int(logits.argmax())
            else:
                probs.append(_probs(logits, temperature))
                d = int(torch.multinomial(probs[-1], 1, generator=generator))
            drafted.append(d)
            x = torch.tensor([[d]], device=self.model.device)
        return drafted, (torch.stack(probs) if probs else None)

    def keep(self, n: int) -> None:
        """Forget cached positions from ``n`` on (the rejected drafts)."""
        rollback(self.cache, min(n, self.cache.length))


@dataclass
class PromptLookup:
    """Draft by copying: find the latest earlier occurrence of the last n tokens (n from
    ``max_ngram`` down to ``min_ngram``) and propose the tokens that followed it."""

    max_ngram: int = 3
    min_ngram: int = 1

    def propose(self, tokens: list[int], k: int, temperature: float = 0.0, generator=None):
        return prompt_lookup(tokens, k, self.max_ngram, self.min_ngram), None

    def keep(self, n: int) -> None:  # nothing cached
        pass


def prompt_lookup(tokens: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1,
                  prefer: str = "latest") -> list[int]:
    """Up to ``k`` tokens that followed an earlier match of the sequence's last n-gram.

    The longest n-gram with a match wins. ``prefer="latest"`` (the course's rule) takes the
    match nearest the end, and the copy may run into the tail itself, as LZ77 does: in a
    sequence that repeats with period P the latest match lies P tokens back, and copying on
    past the end repeats the period, so even a short period yields k tokens.
    ``prefer="earliest"`` is the rule of Saxena's reference implementation and of Hugging
    Face's ``PromptLookupCandidateGenerator``: the first match from the left, its continuation
    cut at the end of the text (as Hugging Face does; the reference requires all k).
    """
    if prefer not in ("latest", "earliest"):
        raise ValueError(f"prefer must be 'latest' or 'earliest', not {prefer!r}")
    T = len(tokens)
    for n in range(min(max_ngram, T - 1), min_ngram - 1, -1):
        tail = tokens[T - n:]
        starts = range(T - n - 1, -1, -1) if prefer == "latest" else range(0, T - n)
        for start in starts:  # a match must end before the tail
            if tokens[start:start + n] == tail:
                if prefer == "earliest":
                    return list(tokens[start + n:min(start + n + k, T)])
                seq = list(tokens)
                for j in range(k):
                    seq.append(seq[start + n + j])  # start + n + j < len(seq): always defined
                return seq[T:]
    return []


def lookup_agreement(tokens: list[int], k: int = 6, prefer: str = "latest",
                     start: int = 16) -> float:
    """Mean number of leading draft tokens that equal the text's real continuation, over every
    position from ``start`` on: how many tokens of each proposal a verifier that reproduced
    this text would keep (a drafter's quality measured on text, with no model)."""
    kept = []
    for t in range(start, len(tokens) - 1):
        draft = prompt_lookup(tokens[:t], k, prefer=prefer)
        n = 0
        while n < len(draft) and t + n < len(tokens) and draft[n] == tokens[t + n]:
            n += 1
        kept.append(n)
    return sum(kept) / len(kept) if kept else 0.0


@dataclass
class SpecStats:
    """What one speculative generation drafted, kept and emitted, verification by verification."""

    drafted: list[int] = field(default_factory=list)   # tokens proposed per verification
    accepted: list[int] = field(default_factory=list)  # of those, tokens kept

    @property
    def verifications(self) -> int:
        return len(self.drafted)

    @property
    def emitted(self) -> int:
        return sum(self.accepted) + self.verifications

    @property
    def tested(self) -> int:
        """Drafted tokens the verifier actually judged: the kept ones and each first rejection."""
        return sum(a + (a < d) for a, d in zip(self.accepted, self.drafted))

    @property
    def acceptance_rate(self) -> float:
        """The chance that a judged draft token is kept: the formula's a (nan if none judged)."""
        return sum(self.accepted) / self.tested if self.tested else float("nan")

    def tokens_per_verification(self, k: int | None = None) -> float:
        """Emitted tokens per target pass, over the passes that drafted ``k`` tokens (all if None)."""
        rows = [a for a, d in zip(self.accepted, self.drafted) if k is None or d == k]
        return (sum(rows) + len(rows)) / len(rows) if rows else float("nan")


@torch.inference_mode()
def speculative_generate(target, drafter, prompt, max_new_tokens: int, k: int = 4,
                         temperature: float = 0.0, seed: int = 0, eos_token_id: int | None = None,
                         verify=None, target_cache=None) -> tuple[list[int], SpecStats]:
    """Prompt plus up to ``max_new_tokens`` tokens from ``target``, drafted by ``drafter``.

    ``drafter`` is a ``ModelDrafter``, a ``PromptLookup`` or anything with ``propose(tokens, k,
    temperature, generator) -> (drafted, probs or None)`` and ``keep(n)``. ``verify`` replaces
    ``greedy_verify`` (temperature 0) or ``sampling_verify``, with the same arguments, so a lab
    can swap exactly that step. ``target_cache``: a ``PagedTarget`` to verify over the paged
    pool (default: a ``ContiguousTarget``). Returns the token list and the ``SpecStats``.
    """
    tokens = [int(t) for t in torch.as_tensor(prompt).flatten().tolist()]
    if not tokens:
        raise ValueError("the prompt is empty: give at least one token")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if len(tokens) + max_new_tokens > target.config.max_seq_len:
        raise ValueError(f"{len(tokens)} prompt + {max_new_tokens} new tokens exceed the "
                         f"target's context of {target.config.max_seq_len}")
    verify = verify or (greedy_verify if temperature == 0 else sampling_verify)
    gen = torch.Generator().manual_seed(seed)
    runner = target_cache or ContiguousTarget(target, len(tokens) + max_new_tokens + k)
    if len(tokens) > 1:  # every prompt token but the last: the first verification feeds that one
        runner.forward(tokens[:-1], 0)
    stats, end = SpecStats(), len(tokens) + max_new_tokens
    drafter.keep(0)  # a drafter reused from another generation starts empty
    while len(tokens) < end:
        k_now = min(k, end - len(tokens) - 1)  # never draft past max_new_tokens
        drafted, q = drafter.propose(tokens, k_now, temperature, gen)
        drafted = drafted[:k_now]
        start = len(tokens) - 1
        logits = runner.forward(tokens[-1:] + drafted, start)  # (k + 1, V)
        d = torch.tensor(drafted, dtype=torch.long)
        if temperature == 0:
            emitted = verify(logits.cpu(), d)
        else:
            p = _probs(logits, temperature).cpu()
            if q is None:  # a deterministic draft: q is one-hot at each drafted token
                q = torch.nn.functional.one_hot(d, p.shape[-1]).double()
            emitted = verify(p, q[:len(drafted)].cpu(), d, gen)
        n = len(emitted) - 1
        stats.drafted.append(len(drafted))
        stats.accepted.append(n)
        runner.keep(start + 1 + n)   # keep last and the n accepted drafts
        drafter.keep(start + 1 + n)
        tokens += emitted
        if eos_token_id is not None and eos_token_id in emitted:
            tokens = tokens[:len(tokens) - len(emitted) + emitted.index(eos_token_id) + 1]
            break
    return tokens[:end], stats
